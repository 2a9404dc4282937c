"""A real Debezium capture of one realistic table, for the realistic benchmark (bench/realistic_benchmark.py).

PostgreSQL (tests/support/capture/postgres.py) -> the embedded Debezium engine
(tests/support/capture/debezium_engine.py) -> Kafka, of one table `accounts` with the column types
real tables have and the project's own workload has not:

    id integer PRIMARY KEY, email varchar(120), revision integer, balance numeric(12,2),
    updated_at timestamptz, birthday date, profile jsonb, external_id uuid, status (an enum),
    tags text[], notes text (SET STORAGE EXTERNAL; a quarter of the rows hold > 2 KB there)

REPLICA IDENTITY DEFAULT, so an update that leaves a TOASTed `notes` alone carries Debezium's
`__debezium_unavailable_value` for it. `email` is `u<id>.<revision>@example.com` and every change
of a row raises `revision`: the freshness section finds each row image's clock there.

`changes` events in all: a snapshot of a fifth of them, then single-row updates (most), inserts
and deletes (each delete is followed by its tombstone) streamed in transactions of 200 statements.
Two engines (started one after the other) capture the same database, one with the Connect schema blocks
(`converter.schemas.enable=true`) and one without, each into a topic of one partition.
"""

from __future__ import annotations

import base64
import json
import random
import shutil
import string
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg

from connectors.kafka.local_broker import free_port
from service.operations.workload import create_topics
from tests.support.capture.debezium_engine import EngineProcess, debezium_properties
from tests.support.capture.postgres import PostgresCluster, pg_bindir

TABLE = "accounts"
SCHEMA = "public"
STATUSES = ("new", "active", "suspended", "closed")
DDL = f"""
CREATE TYPE account_status AS ENUM ({", ".join(f"'{s}'" for s in STATUSES)});
CREATE TABLE {TABLE} (
    id integer PRIMARY KEY,
    email varchar(120) NOT NULL,
    revision integer NOT NULL,
    balance numeric(12,2) NOT NULL,
    updated_at timestamptz NOT NULL,
    birthday date,
    profile jsonb,
    external_id uuid NOT NULL,
    status account_status NOT NULL,
    tags text[],
    notes text
);
ALTER TABLE {TABLE} ALTER COLUMN notes SET STORAGE EXTERNAL;
"""
COLUMNS = ("id", "email", "revision", "balance", "updated_at", "birthday", "profile", "external_id", "status",
           "tags", "notes")
UNAVAILABLE = "__debezium_unavailable_value"
LARGE_NOTES_SHARE = 0.25
LARGE_NOTES_CHARS = (2_100, 3_200)
SMALL_NOTES_CHARS = (10, 120)
TAGS = ("vip", "b2b", "trial", "churn-risk", "größe", "🏷", "o'neil", "beta")
STATEMENTS_PER_TRANSACTION = 200
SNAPSHOT_SHARE = 5  # a fifth of the changes are snapshot rows
INSERT_SHARE, DELETE_SHARE, NEW_NOTES_SHARE = 0.06, 0.04, 0.03
CAPTURE_TIMEOUT_S = 1_800.0
ALPHABET = string.ascii_letters + string.digits + " "
EPOCH_DAY = date(1970, 1, 1)


def _quote(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, (int, Decimal)):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def _email(key: int, revision: int) -> str:
    return f"u{key}.{revision}@example.com"


class AccountsWorkload:
    """The SQL of the snapshot rows and of the streamed changes; counts the records Debezium will write."""

    def __init__(self, changes: int, seed: int = 27) -> None:
        self.rng = random.Random(seed)
        self.snapshot_rows = max(1, changes // SNAPSHOT_SHARE)
        self.streamed = max(0, changes - self.snapshot_rows)
        self.live: list[int] = []
        self.position: dict[int, int] = {}
        self.revision: dict[int, int] = {}
        self.next_id = 1
        self.records = 0  # Kafka records the capture yields (a delete yields two: it and its tombstone)
        self.changes = 0

    def _add(self, key: int) -> None:
        self.position[key] = len(self.live)
        self.live.append(key)

    def _remove(self, key: int) -> None:
        at = self.position.pop(key)
        last = self.live.pop()
        if at < len(self.live):
            self.live[at] = last
            self.position[last] = at

    def _notes(self) -> str:
        large = self.rng.random() < LARGE_NOTES_SHARE
        return "".join(self.rng.choices(ALPHABET, k=self.rng.randint(*(LARGE_NOTES_CHARS if large
                                                                       else SMALL_NOTES_CHARS))))

    def _timestamp(self) -> str:
        moment = datetime(2020, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=self.rng.randrange(2 * 10**14))
        zone = timezone(timedelta(minutes=self.rng.choice((0, 60, -300, 330))))
        return moment.astimezone(zone).isoformat()

    def _profile(self) -> str:
        return json.dumps({"plan": self.rng.choice(("free", "pro", "team")), "score": self.rng.randint(0, 999),
                           "flags": {"beta": self.rng.random() < 0.3}, "city": self.rng.choice(("Oslo", "Łódź",
                                                                                               "São Paulo"))})

    def _tags(self) -> str:
        chosen = self.rng.sample(TAGS, self.rng.randint(0, 3))
        return "{" + ",".join('"' + t.replace('"', '\\"') + '"' for t in chosen) + "}"

    def _insert(self) -> str:
        key, self.next_id = self.next_id, self.next_id + 1
        self.revision[key] = 0
        self._add(key)
        cents = self.rng.randint(-10**11 + 1, 10**11 - 1)
        birthday = None if self.rng.random() < 0.1 else (EPOCH_DAY + timedelta(days=self.rng.randint(-15_000, 15_000)))
        values = (key, _email(key, 0), 0, Decimal(cents).scaleb(-2), self._timestamp(), birthday and birthday.isoformat(),
                  None if self.rng.random() < 0.1 else self._profile(), str(uuid.UUID(int=self.rng.getrandbits(128))),
                  self.rng.choice(STATUSES), None if self.rng.random() < 0.1 else self._tags(), self._notes())
        self.records += 1
        self.changes += 1
        return f"INSERT INTO {TABLE} VALUES ({', '.join(map(_quote, values))});"

    def _update(self) -> str:
        key = self.live[self.rng.randrange(len(self.live))]
        revision = self.revision[key] = self.revision[key] + 1
        sets = [f"revision = {revision}", f"email = {_quote(_email(key, revision))}",
                f"updated_at = {_quote(self._timestamp())}"]
        which = self.rng.random()
        if which < 0.35:
            sets.append(f"balance = balance + {Decimal(self.rng.randint(-50_000, 50_000)).scaleb(-2)}")
        elif which < 0.55:
            sets.append(f"profile = jsonb_set(coalesce(profile, '{{}}'), '{{score}}', '{self.rng.randint(0, 999)}')")
        elif which < 0.70:
            sets.append(f"status = {_quote(self.rng.choice(STATUSES))}")
        elif which < 0.85:
            sets.append(f"tags = {_quote(self._tags())}")
        else:
            sets.append(f"birthday = {_quote((EPOCH_DAY + timedelta(days=self.rng.randint(-15_000, 15_000))).isoformat())}")
        if self.rng.random() < NEW_NOTES_SHARE:
            sets.append(f"notes = {_quote(self._notes())}")
        self.records += 1
        self.changes += 1
        return f"UPDATE {TABLE} SET {', '.join(sets)} WHERE id = {key};"

    def _delete(self) -> str:
        key = self.live[self.rng.randrange(len(self.live))]
        self._remove(key)
        self.records += 2
        self.changes += 1
        return f"DELETE FROM {TABLE} WHERE id = {key};"

    def snapshot_sql(self) -> str:
        """The table and its snapshot rows."""
        return DDL + "\n".join(self._insert() for _ in range(self.snapshot_rows)) + "\n"

    def streaming_sql(self) -> str:
        """The streamed changes, STATEMENTS_PER_TRANSACTION to a transaction."""
        lines = []
        for number in range(self.streamed):
            if number % STATEMENTS_PER_TRANSACTION == 0:
                lines.append("BEGIN;" if number == 0 else "COMMIT;\nBEGIN;")
            draw = self.rng.random()
            if draw < INSERT_SHARE or len(self.live) < 2:
                lines.append(self._insert())
            elif draw < INSERT_SHARE + DELETE_SHARE:
                lines.append(self._delete())
            else:
                lines.append(self._update())
        if lines:
            lines.append("COMMIT;")
        return "\n".join(lines) + "\n"

    def final_emails(self) -> dict[int, str]:
        """The email (and so the clock) of every live row at the end."""
        return {key: _email(key, self.revision[key]) for key in self.live}


@dataclass
class CapturedTopics:
    """Where the capture landed: one topic of one partition per converter setting."""

    with_schemas: str
    without_schemas: str
    records: int
    changes: int
    rows: list[dict]  # SELECT * of the source table at the end
    final_emails: dict[int, str]
    timings: dict[str, float] = field(default_factory=dict)


def select_star(cluster: PostgresCluster, dbname: str) -> list[dict]:
    """Every row of the source table, as psycopg returns them."""
    with psycopg.connect(cluster.conninfo(dbname)) as conn:
        cursor = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM {TABLE} ORDER BY id")
        return [dict(zip(COLUMNS, row)) for row in cursor.fetchall()]


def capture(bootstrap: str, changes: int, workdir: Path, log=print) -> CapturedTopics:
    """Run the whole capture (see the module docstring); the PostgreSQL cluster is stopped at the end."""
    bindir = pg_bindir()
    if bindir is None:
        raise SystemExit("FAILED: no PostgreSQL under /usr/lib/postgresql: run `bash scripts/install.sh test`")
    cluster = PostgresCluster(bindir, Path(tempfile.mkdtemp(prefix="cdc-rb-pg-")), free_port())
    unique = uuid.uuid4().hex[:8]
    dbname = f"rb_{unique}"
    workload, timings = AccountsWorkload(changes), {}
    started = time.monotonic()
    cluster.start()
    try:
        cluster.execute(f"CREATE DATABASE {dbname}", dbname="postgres")
        _run_sql(cluster, workdir, "snapshot", workload.snapshot_sql(), dbname)
        timings["snapshot rows (SQL)"] = round(time.monotonic() - started, 1)
        streaming = workload.streaming_sql()  # before the engines start: the count they must reach
        engines, topics = [], {}
        for schemas in ("on", "off"):
            prefix = f"rb{unique}{schemas}"
            topics[schemas] = f"{prefix}.{SCHEMA}.{TABLE}"
            create_topics(bootstrap, [topics[schemas]], 1)
            engine_dir = workdir / f"engine-{schemas}"
            engine_dir.mkdir()
            properties = debezium_properties(name=f"rb_{unique}_{schemas}", port=cluster.port, dbname=dbname,
                                             prefix=prefix, tables=[f"{SCHEMA}.{TABLE}"], workdir=engine_dir,
                                             schemas=schemas)
            engine = EngineProcess(properties, bootstrap, engine_dir, topics[schemas], workload.records)
            engine.command += ["--max-seconds", str(CAPTURE_TIMEOUT_S), "--idle-seconds", "3"]
            engines.append((engine, properties["slot.name"], topics[schemas]))
        try:
            for engine, _, _ in engines:  # one after the other: a new slot waits for the other's snapshot
                engine.start().wait_streaming(timeout=CAPTURE_TIMEOUT_S)
            timings["engines started, snapshot taken"] = round(time.monotonic() - started, 1)
            _run_sql(cluster, workdir, "streaming", streaming, dbname)
            timings["streamed changes (SQL)"] = round(time.monotonic() - started, 1)
            for engine, _, topic in engines:
                produced = engine.wait_captured(timeout=CAPTURE_TIMEOUT_S).get(topic, 0)
                if produced != workload.records:
                    raise SystemExit(f"FAILED: the engine produced {produced} records to {topic}, "
                                     f"expected {workload.records} (a retried batch: at-least-once)")
            timings["captured"] = round(time.monotonic() - started, 1)
        finally:
            for engine, slot, _ in engines:
                engine.stop()  # a no-op for an engine that was never started or has stopped
                cluster.drop_replication_slot(slot)
        rows = select_star(cluster, dbname)
    finally:
        cluster.stop()
        shutil.rmtree(cluster.base, ignore_errors=True)
    log(f"capture: {workload.records:,} records ({workload.changes:,} changes, {len(rows):,} live rows) "
        f"in {time.monotonic() - started:.0f} s; timings {timings}")
    return CapturedTopics(topics["on"], topics["off"], workload.records, workload.changes, rows,
                          workload.final_emails(), timings)


def _run_sql(cluster: PostgresCluster, workdir: Path, name: str, sql: str, dbname: str) -> None:
    path = workdir / f"{name}.sql"
    path.write_text(sql)
    cluster.run_file(path, dbname)


# --- comparing a Delta table with SELECT * ----------------------------------------------------

def _decimal(value: Any, scale: int = 2) -> Decimal | None:
    if value is None or isinstance(value, Decimal):
        return value
    if isinstance(value, str):  # Connect Decimal in JSON: base64 of the unscaled two's complement
        value = base64.b64decode(value)
    if isinstance(value, (bytes, bytearray)):
        return Decimal(int.from_bytes(value, "big", signed=True)).scaleb(-scale)
    return Decimal(str(value)).quantize(Decimal(1).scaleb(-scale))


def _instant(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    elif isinstance(value, int):  # epoch micros
        value = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def _day(value: Any) -> date | None:
    if value is None or isinstance(value, date):
        return value
    if isinstance(value, int):  # io.debezium.time.Date: days since the epoch
        return EPOCH_DAY + timedelta(days=value)
    return date.fromisoformat(str(value))


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def _list(value: Any) -> list | None:
    if isinstance(value, (str, bytes)):  # an array kept as JSON text
        value = json.loads(value)
    return None if value is None else list(value)


NORMALISE = {"balance": _decimal, "updated_at": _instant, "birthday": _day, "profile": _json,
             "external_id": lambda v: None if v is None else str(v), "tags": _list}


def normalised(row: dict) -> tuple:
    """A row's values in one representation whichever way they were typed (see NORMALISE)."""
    return tuple(NORMALISE.get(name, lambda v: v)(row.get(name)) for name in COLUMNS)


def compare_with_source(table_rows: list[dict], source_rows: list[dict]) -> str | None:
    """None when the Delta rows equal SELECT * (after NORMALISE); else what differs, briefly."""
    got = {row["id"]: normalised(row) for row in table_rows}
    want = {row["id"]: normalised(row) for row in source_rows}
    if len(got) != len(table_rows):
        return f"{len(table_rows) - len(got)} duplicate keys"
    missing, extra = want.keys() - got.keys(), got.keys() - want.keys()
    differing = [key for key in want.keys() & got.keys() if got[key] != want[key]]
    if not (missing or extra or differing):
        return None
    example = ""
    if differing:
        key = min(differing)
        columns = [name for name, a, b in zip(COLUMNS, got[key], want[key]) if a != b]
        example = (f"; e.g. id {key}: " + ", ".join(f"{name} {got[key][COLUMNS.index(name)]!r:.60} != "
                                                     f"{want[key][COLUMNS.index(name)]!r:.60}" for name in columns[:3]))
    return f"{len(missing)} rows missing, {len(extra)} extra, {len(differing)} differ{example}"
