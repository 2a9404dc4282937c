"""Database benchmark (issue 24): one table of 200,000 changes against 200 tables of 1,000 each.

One run, one broker (Apache Kafka from the project's Maven cache, `ApacheKafkaBroker`, or the
broker named by `--bootstrap` / KAFKA_BOOTSTRAP), Debezium JSON envelopes without the Connect
schema block (`{"before", "after", "op", "source": {"schema", "table", "lsn", "ts_ms"}, "ts_ms"}`,
columns id, name, amount, updated_at), keyed by the primary key as Debezium keys them
(`{"id": 17}`), 2 partitions per topic, creates, updates and deletes (each followed by a
tombstone, as Debezium writes them):

- single:     1 table x `--changes` changes over `--keys` keys (topic `single.public.t000`), one
              `pipelines:` block, `cdc-lakehouse run --until-idle`: wall and peak RSS of the process tree.
- database:   `--tables` tables x (`--changes` / `--tables`) changes each over (`--keys` / `--tables`)
              keys each (topics `bench.public.t000` ...), one service with one `databases:` source
              (tables `public_t000` ...), `run --until-idle`: wall and peak RSS.
- pipelines:  (`--per-table-pipelines`) the same topics as one `pipelines:` block per table.
- freshness:  `cdc-lakehouse run` (1 s trigger) with the database source, continuing the
              `database` section's checkpoint and tables, while a producer writes a steady `--rate`
              changes/s spread over every topic for `--rate-seconds` (inserts and updates only:
              a deleted row image cannot tell which delete it came from). Latency per change: the
              commit timestamp of the first Delta version holding its row image (or a later one of
              its key; `updated_at` is the workload's clock) minus the time it was handed to
              librdkafka, as in `perf_freshness.py` (whose paced producer and service wrapper this uses).

After `single`, `database`, `pipelines` and `freshness` every Delta table is read with `deltalake`
and compared with its replay (per key the last row image, deleted keys absent): the mismatch
count is printed (tables and rows). Nothing is asserted about speed. From the service log's
`batch N -> ... (read+decode+reduce Xs, merge Ys)` lines the table also sums where the time went.

    cd /work/main
    nice -n 10 .venv/bin/python bench/database_benchmark.py                         # everything but per-table pipelines
    nice -n 10 .venv/bin/python bench/database_benchmark.py --per-table-pipelines   # and the 200 pipelines
    .venv/bin/python bench/database_benchmark.py --quick                            # 20 tables x 1,000, 30 s at 500/s
    .venv/bin/python bench/database_benchmark.py --only single,pipelines --tables 20 --changes 10000
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import yaml
from deltalake import DeltaTable
from cpu_samples import tree_rss_mib
from ingest_benchmark import _log_time
from perf_freshness import PacedProducer, Service, percentile

from service.operations.workload import Event, create_topics, produce

SECTIONS = ("single", "database", "pipelines", "freshness")
CLI = str(Path(sys.executable).with_name("cdc-lakehouse"))
COLUMNS = ("id", "name", "amount", "updated_at")
DATABASE = "bench"
TOPIC_PATTERN = r"bench\.(?P<schema>[^.]+)\.(?P<table>[^.]+)"
TABLE_NAME = "{schema}_{table}"
SINGLE_TOPIC = "single.public.t000"
SINGLE_TABLE = "single_t000"
BASE_MS = 1_790_000_000_000
DELETE_SHARE = 0.1
RSS_SAMPLE_S = 0.5
POLL_S = 2.0
BUSY_LOAD = 1.5
_LOG_TIME = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO "
_READY = re.compile(_LOG_TIME + r"[\w.]*runner: kafka: ", re.M)
_TIMES = r"\(read\+decode\+reduce ([\d.]+)s, merge ([\d.]+)s\)"
# a pipeline's micro-batch (one table): `pipeline NAME: batch N -> URI: U upserts, D deletes (...)`
_BATCH = re.compile(_LOG_TIME + r"[\w.]+: pipeline (\S+): batch (\d+) -> (\S+): (\d+) upserts, (\d+) deletes "
                    + _TIMES, re.M)
# a database source's micro-batch (every table in it): `database NAME: batch N -> T table(s) (...)`
_DATABASE_BATCH = re.compile(_LOG_TIME + r"[\w.]+: database (\S+): batch (\d+) -> (\d+) table\(s\) " + _TIMES, re.M)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line flags."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--only", default="single,database,freshness",
                        help=f"comma-separated sections out of {','.join(SECTIONS)}")
    parser.add_argument("--per-table-pipelines", action="store_true", help="add the pipelines section")
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--changes", type=int, default=200_000, help="changes in all (tombstones not counted)")
    parser.add_argument("--keys", type=int, default=50_000, help="primary keys in all")
    parser.add_argument("--partitions", type=int, default=2, help="partitions per topic")
    parser.add_argument("--rate", type=float, default=2_000, help="freshness: changes/s over all topics")
    parser.add_argument("--rate-seconds", type=float, default=60)
    parser.add_argument("--freshness-with", choices=["database", "pipelines"], default="database",
                        help="freshness: the `databases:` source, or one `pipelines:` block per table")
    parser.add_argument("--drain-seconds", type=float, default=600, help="freshness: wait for the tables at most")
    parser.add_argument("--timeout", type=float, default=3_600, help="seconds one run --until-idle may take")
    parser.add_argument("--database-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of the `databases:` entry (VALUE as YAML), e.g. parallel_merges=4")
    parser.add_argument("--quick", action="store_true",
                        help="--tables 20 --changes 20000 --keys 5000 --rate 500 --rate-seconds 30")
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP"),
                        help="use this broker (default: KAFKA_BOOTSTRAP, else Apache Kafka started for the run)")
    parser.add_argument("--workdir", help="keep tables, checkpoints and logs here (default: a temp dir, removed)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--seed", type=int, default=24)
    args = parser.parse_args(argv)
    if args.quick:
        args.tables, args.changes, args.keys, args.rate, args.rate_seconds = 20, 20_000, 5_000, 500, 30
    args.sections = [s.strip() for s in args.only.split(",") if s.strip()]
    if args.per_table_pipelines and "pipelines" not in args.sections:
        args.sections.insert(args.sections.index("freshness") if "freshness" in args.sections else
                             len(args.sections), "pipelines")
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {','.join(SECTIONS)}")
    if args.tables > 1000 or args.keys < args.tables:
        parser.error("--tables at most 1000 (t000 .. t999) and --keys at least --tables")
    return args


# --- the workload ---------------------------------------------------------------------------

class Clock:
    """One clock for every table: `updated_at` (ms) and the source LSN grow with it."""

    def __init__(self) -> None:
        self.value = 0

    def tick(self) -> int:
        self.value += 1
        return self.value


class TableWorkload:
    """Debezium envelopes for one source table `public.<table>` keyed by `id`; its replay."""

    def __init__(self, topic: str, table: str, partitions: int, keys: int, clock: Clock, rng: random.Random) -> None:
        self.topic, self.table, self.partitions, self.keys = topic, table, partitions, keys
        self.clock, self.rng = clock, rng
        self.rows: dict[int, dict] = {}  # the replay: each live key's last row image

    def _row(self, key: int, tick: int) -> dict:
        return {"id": key, "name": f"name-{key}-{tick}", "amount": round(self.rng.uniform(-1e4, 1e4), 2) + 0.005,
                "updated_at": BASE_MS + tick}

    def _event(self, key: int, value: bytes | None) -> Event:
        raw_key = json.dumps({"id": key}).encode()
        return Event(self.topic, zlib.crc32(raw_key) % self.partitions, raw_key, value)

    def change(self, key: int, deletes: bool = True) -> list[Event]:
        """The next change of `key`: a create when it is not live, else an update or (sometimes) a
        delete and its tombstone."""
        tick = self.clock.tick()
        before = self.rows.get(key)
        if before is None:
            op, after = "c", self._row(key, tick)
        elif deletes and self.rng.random() < DELETE_SHARE:
            op, after = "d", None
        else:
            op, after = "u", self._row(key, tick)
        envelope = {"before": before, "after": after, "op": op,
                    "source": {"version": "2.7.0.Final", "connector": "postgresql", "name": "bench",
                               "db": "bench", "schema": "public", "table": self.table, "lsn": 1_000_000 + 8 * tick,
                               "ts_ms": BASE_MS + tick},
                    "ts_ms": BASE_MS + tick + 3}
        events = [self._event(key, json.dumps(envelope, separators=(",", ":")).encode())]
        if after is None:
            del self.rows[key]
            events.append(self._event(key, None))
        else:
            self.rows[key] = after
        return events

    def generate(self, changes: int) -> list[Event]:
        """`changes` changes: creates of the first keys, then random changes over all keys."""
        events: list[Event] = []
        for key in range(min(self.keys, changes)):
            events += self.change(key)
        for _ in range(changes - min(self.keys, changes)):
            events += self.change(self.rng.randrange(self.keys))
        return events

    def expected(self) -> list[dict]:
        """The replay, sorted by id."""
        return [self.rows[key] for key in sorted(self.rows)]


def table_names(count: int) -> list[str]:
    """t000, t001, ..."""
    return [f"t{i:03d}" for i in range(count)]


# --- broker, configs, one service run -------------------------------------------------------

@contextmanager
def broker(bootstrap: str | None, workdir: Path) -> Iterator[str]:
    """The given bootstrap servers, or Apache Kafka started (and stopped) for the run."""
    if bootstrap:
        yield bootstrap
        return
    from connectors.kafka.apache_broker import ApacheKafkaBroker

    with ApacheKafkaBroker(workdir / "broker") as kafka:
        yield kafka.bootstrap_servers


def base_config(workdir: Path, bootstrap: str) -> dict:
    """What every config of this benchmark shares (service defaults otherwise)."""
    return {"kafka": {"bootstrap_servers": bootstrap}, "lakehouse": {"root": str(workdir / "tables")},
            "checkpoint_root": str(workdir / "checkpoints"), "spark": {"master": "local[*]"}}


def pipeline_block(topic: str, table: str) -> dict:
    """One ordinary `pipelines:` entry."""
    return {"name": table, "topics": [topic], "table": table, "primary_key": ["id"]}


def database_block(options: list[str] = ()) -> dict:
    """The `databases:` entry, exactly the issue's shape, plus `--database-option`s."""
    extra = {key: yaml.safe_load(value) for key, value in (option.split("=", 1) for option in options)}
    return {"name": DATABASE, "topic_pattern": TOPIC_PATTERN, "table_name": TABLE_NAME, **extra}


def write_config(workdir: Path, config: dict) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@dataclass
class LogFigures:
    """What the service log says: batch lines (per table and micro-batch) and their times."""

    merges: int = 0
    tables: int = 0
    upserts: int = 0
    deletes: int = 0
    read_s: float = 0.0
    merge_s: float = 0.0
    read_max_s: float = 0.0
    merge_max_s: float = 0.0
    ready_at: float | None = None
    first_commit_at: float | None = None
    last_commit_at: float | None = None
    batch_ids: set = field(default_factory=set)

    @classmethod
    def parse(cls, text: str) -> "LogFigures":
        out = cls()
        ready = _READY.search(text)
        out.ready_at = _log_time(ready.group(1)) if ready else None
        tables = set()
        for at, name, batch, uri, upserts, deletes, read_s, merge_s in _BATCH.findall(text):
            when = _log_time(at)
            out.first_commit_at = when if out.first_commit_at is None else min(out.first_commit_at, when)
            out.last_commit_at = when if out.last_commit_at is None else max(out.last_commit_at, when)
            out.merges += 1
            tables.add(uri)
            out.batch_ids.add((name, int(batch)))
            out.upserts += int(upserts)
            out.deletes += int(deletes)
            out.read_s += float(read_s)
            out.merge_s += float(merge_s)
            out.read_max_s = max(out.read_max_s, float(read_s))
            out.merge_max_s = max(out.merge_max_s, float(merge_s))
        for at, name, batch, merged, read_s, merge_s in _DATABASE_BATCH.findall(text):
            when = _log_time(at)
            out.first_commit_at = when if out.first_commit_at is None else min(out.first_commit_at, when)
            out.last_commit_at = when if out.last_commit_at is None else max(out.last_commit_at, when)
            out.merges += int(merged)
            out.batch_ids.add((name, int(batch)))
            out.read_s += float(read_s)
            out.merge_s += float(merge_s)
            out.read_max_s = max(out.read_max_s, float(read_s))
            out.merge_max_s = max(out.merge_max_s, float(merge_s))
        out.tables = len(tables)
        return out

    def summary(self, launched: float) -> dict:
        figures = {"log_merges": self.merges, "log_tables": self.tables, "log_batches": len(self.batch_ids),
                   "log_upserts": self.upserts, "log_deletes": self.deletes,
                   "read_s_sum": self.read_s, "merge_s_sum": self.merge_s,
                   "read_s_max": self.read_max_s, "merge_s_max": self.merge_max_s}
        if self.ready_at is not None:
            figures["ready_s"] = self.ready_at - launched
        if self.first_commit_at is not None:
            figures["first_commit_s"] = self.first_commit_at - launched
            figures["last_commit_s"] = self.last_commit_at - launched
        return figures


def run_until_idle(config: Path, log_path: Path, timeout_s: float) -> dict:
    """`cdc-lakehouse run CONFIG --until-idle` in its own session: wall, peak RSS of the process tree,
    the log's figures. A run past `timeout_s` is killed (its process group) and reported."""
    peak = 0.0
    with open(log_path, "w") as log:
        launched = time.time()
        process = subprocess.Popen([CLI, "run", str(config), "--until-idle"], stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        while process.poll() is None:
            peak = max(peak, tree_rss_mib(process.pid))
            if time.time() - launched > timeout_s:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                break
            time.sleep(RSS_SAMPLE_S)
        ended = time.time()
    text = log_path.read_text()
    figures = {"wall_s": ended - launched, "rss_mib": peak, "exit": process.returncode,
               **LogFigures.parse(text).summary(launched)}
    if process.returncode != 0:
        errors = [line for line in text.splitlines() if "error" in line.lower()]
        figures["failed"] = (f"timed out after {timeout_s:.0f} s" if ended - launched > timeout_s else
                             f"exit {process.returncode}: {(errors or text.splitlines() or ['?'])[-1][:300]}")
        print(f"  FAILED: {figures['failed']} (log {log_path})", flush=True)
    return figures


# --- checks ---------------------------------------------------------------------------------

def compare(uri: str, expected: list[dict]) -> tuple[int, str]:
    """(rows that differ from the replay, a note); a missing table counts every expected row."""
    try:
        table = DeltaTable(uri).to_pyarrow_table(columns=list(COLUMNS)).sort_by("id")
    except Exception as error:  # noqa: BLE001 - a missing table or column is a mismatch
        return max(1, len(expected)), f"{uri}: {type(error).__name__}: {str(error)[:200]}"
    got = {row["id"]: row for row in table.to_pylist()}
    want = {row["id"]: row for row in expected}
    wrong = sum(1 for key in got.keys() & want.keys() if got[key] != want[key])
    missing, extra = len(want.keys() - got.keys()), len(got.keys() - want.keys())
    bad = wrong + missing + extra + (table.num_rows - len(got))
    note = f"{uri}: {wrong} differ, {missing} missing, {extra} extra, {table.num_rows - len(got)} doubled" if bad else ""
    return bad, note


def verify(root: Path, tables: dict[str, TableWorkload]) -> dict:
    """Every table against its replay: mismatching tables and rows."""
    started = time.perf_counter()
    bad_tables = bad_rows = rows = 0
    notes = []
    for name, workload in tables.items():
        expected = workload.expected()
        rows += len(expected)
        bad, note = compare(str(root / name), expected)
        if bad:
            bad_tables, bad_rows = bad_tables + 1, bad_rows + bad
            notes.append(note)
    for note in notes[:5]:
        print(f"  mismatch: {note}", flush=True)
    return {"tables": len(tables), "rows": rows, "bad_tables": bad_tables, "bad_rows": bad_rows,
            "verify_s": time.perf_counter() - started}


# --- sections -------------------------------------------------------------------------------

def produce_workloads(bootstrap: str, workloads: list[TableWorkload], per_table: int,
                      partitions: int) -> tuple[int, float]:
    """Create the topics and produce `per_table` changes into each, interleaved across tables the way
    one database's transactions land in its topics; (records, seconds)."""
    create_topics(bootstrap, [w.topic for w in workloads], partitions)
    streams = [iter(w.generate(per_table)) for w in workloads]
    started = time.perf_counter()
    count = produce(bootstrap, interleave(streams))
    return count, time.perf_counter() - started


def interleave(streams: list[Iterator[Event]]) -> Iterator[Event]:
    """Round-robin over the streams until every one is exhausted."""
    live = list(streams)
    while live:
        for stream in list(live):
            event = next(stream, None)
            if event is None:
                live.remove(stream)
            else:
                yield event


def service_section(name: str, workdir: Path, config: dict, workloads: dict[str, TableWorkload],
                    changes: int, timeout_s: float) -> dict:
    """One `run --until-idle`, then every table against its replay."""
    path = write_config(workdir, config)
    print(f"{name}: run --until-idle ({len(workloads)} table(s), config {path})", flush=True)
    figures = run_until_idle(path, workdir / "service.log", timeout_s)
    figures["changes"] = changes
    figures["check"] = verify(workdir / "tables", workloads)
    check = figures["check"]
    print(f"  {name}: wall {figures['wall_s']:.1f} s, peak RSS {figures['rss_mib']:,.0f} MiB, "
          f"{figures.get('log_merges', 0)} MERGEs in {figures.get('log_batches', 0)} batch(es); "
          f"mismatches {check['bad_tables']} table(s), {check['bad_rows']} row(s)", flush=True)
    return figures


def freshness_section(args: argparse.Namespace, bootstrap: str, workdir: Path, config: dict,
                      workloads: dict[str, TableWorkload]) -> dict:
    """`cdc-lakehouse run` (1 s trigger) with the database source while a paced producer writes."""
    path = write_config(workdir, {**config, "trigger_interval_seconds": 1})
    root = workdir / "tables"
    fresh_start = not (workdir / "checkpoints").exists()
    if fresh_start:  # the section before did not run
        create_topics(bootstrap, [w.topic for w in workloads.values()], args.partitions)
    service = Service(CLI, path, workdir / "freshness.log")
    out: dict = {"rate": args.rate, "seconds": args.rate_seconds, "continued": not fresh_start}
    print(f"freshness: run (1 s trigger) over {len(workloads)} tables, "
          f"{'fresh tables' if fresh_start else f'continuing the {workdir.name} section'}", flush=True)
    try:
        service.start()
        # A first input once the service runs (a few creates per table, or one change each when
        # continuing): the steady phase starts when every table holds it, so every query is up.
        produce(bootstrap, interleave([iter(w.generate(min(5, w.keys)) if fresh_start else w.change(0, deletes=False))
                                       for w in workloads.values()]))
        if not wait_drained(root, workloads, service, args.timeout):
            raise SystemExit("FAILED: the tables never caught up with the first input")
        out["ready_s"] = time.time() - service.launched
        out["first_commit_s"] = LogFigures.parse((workdir / "freshness.log").read_text()).summary(
            service.launched).get("first_commit_s")
        versions = {name: DeltaTable(str(root / name)).version() for name in workloads}
        log_offset = (workdir / "freshness.log").stat().st_size
        names = list(workloads)
        rng = random.Random(args.seed + 1)
        planned: list[tuple[Event, int, int]] = []
        owners: list[str] = []
        for _ in range(int(args.rate * args.rate_seconds)):
            name = names[rng.randrange(len(names))]
            workload = workloads[name]
            key = rng.randrange(workload.keys)
            (event,) = workload.change(key, deletes=False)
            planned.append((event, key, workload.rows[key]["updated_at"]))
            owners.append(name)
        print(f"  steady input: {len(planned):,} changes at {args.rate:,.0f}/s "
              f"({time.time() - service.launched:.0f} s after launch)", flush=True)
        producer = PacedProducer(bootstrap, planned, args.rate)
        producer.start()
        producer.join()
        if producer.error is not None:
            raise SystemExit(f"FAILED: producer: {producer.error}")
        out.update(events=len(producer.sent), produced_rate=len(producer.sent) / producer.seconds)
        drain_started = time.monotonic()
        out["drained"] = wait_drained(root, workloads, service, args.drain_seconds)
        out["drain_s"] = time.monotonic() - drain_started
        if out["drained"]:
            values = latencies(root, versions, producer.sent, owners)
            out.update(p50=percentile(values, 0.5), p95=percentile(values, 0.95), max=max(values))
        with open(workdir / "freshness.log") as log:
            log.seek(log_offset)
            steady_log = LogFigures.parse(log.read())
        out.update({f"steady_{k}": v for k, v in steady_log.summary(service.launched).items()})
    finally:
        service.stop()
        out["rss_mib"] = service.peak_rss_mib
        out["exit"] = service.process.returncode if service.process else None
    out["check"] = verify(root, workloads)
    print(f"  freshness: {json.dumps({k: v for k, v in out.items() if k != 'check'}, default=str)}", flush=True)
    return out


def wait_drained(root: Path, workloads: dict[str, TableWorkload], service: Service, timeout: float) -> bool:
    """Wait until every table holds each live key's latest `updated_at`; False on timeout."""
    deadline = time.monotonic() + timeout
    pending = dict(workloads)
    while time.monotonic() < deadline:
        service.check_alive()
        for name in list(pending):
            want = {(key, row["updated_at"]) for key, row in workloads[name].rows.items()}
            try:
                table = DeltaTable(str(root / name)).to_pyarrow_table(columns=["id", "updated_at"])
                got = set(zip(table.column("id").to_pylist(), table.column("updated_at").to_pylist()))
            except Exception:  # noqa: BLE001 - the table is created by its first batch
                continue
            if got == want:
                del pending[name]
        if not pending:
            return True
        time.sleep(POLL_S)
    print(f"  not caught up: {len(pending)} table(s), e.g. {sorted(pending)[:3]}", flush=True)
    return False


def latencies(root: Path, versions: dict[str, int], sent: list, owners: list[str]) -> list[float]:
    """Per change, seconds from production to the commit of the first Delta version of its table
    holding its row image (or a later image of its key)."""
    by_table: dict[str, list[int]] = {}
    for index, name in enumerate(owners[:len(sent)]):
        by_table.setdefault(name, []).append(index)
    out = []
    for name, indexes in by_table.items():
        table = DeltaTable(str(root / name))
        commits = {entry["version"]: entry["timestamp"] / 1000 for entry in table.history()}
        feed = pa.table(table.load_cdf(starting_version=versions[name] + 1,
                                       columns=["id", "updated_at", "_change_type", "_commit_version"]).read_all())
        images: dict[int, list[tuple[int, int]]] = {}
        for key, clock, kind, version in zip(*(feed.column(c).to_pylist() for c in feed.column_names)):
            if kind in ("insert", "update_postimage"):
                images.setdefault(key, []).append((clock, version))
        for seen in images.values():
            seen.sort()
        for index in indexes:
            event = sent[index]
            seen = images.get(event.key, [])
            at = bisect.bisect_left(seen, (event.clock, -1))
            if at == len(seen):
                raise SystemExit(f"FAILED: {name} key {event.key} at updated_at {event.clock} never reached Delta")
            out.append(commits[seen[at][1]] - event.at)
    return out


# --- the table ------------------------------------------------------------------------------

def load() -> dict:
    """`uptime` and the 1-minute load."""
    text = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    if os.getloadavg()[0] > BUSY_LOAD:
        print(f"WARNING: load {os.getloadavg()[0]:.2f} > {BUSY_LOAD}: the machine is busy", flush=True)
    return {"uptime": text, "load1": os.getloadavg()[0]}


def _where(run: dict) -> str:
    if "log_merges" not in run or not run["log_merges"]:
        return ""
    return (f"{run['log_merges']:,} MERGEs in {run['log_batches']:,} batch(es); read+decode+reduce "
            f"{run['read_s_sum']:.1f} s, merge {run['merge_s_sum']:.1f} s summed (max {run['read_s_max']:.1f} / "
            f"{run['merge_s_max']:.1f} s)")


def rows_of(results: dict) -> list[tuple[str, str, str]]:
    """(what, figure, note) rows of the printed table."""
    rows: list[tuple[str, str, str]] = []
    labels = {"single": "1 table x {changes:,} changes, `pipelines:` (1 block)",
              "database": "{tables} tables x {per:,} changes, `databases:` (1 source)",
              "pipelines": "{tables} tables x {per:,} changes, `pipelines:` ({tables} blocks)"}
    for name in ("single", "database", "pipelines"):
        run = results.get(name)
        if not run:
            continue
        label = labels[name].format(changes=run["changes"], tables=run.get("tables", 1),
                                    per=run["changes"] // max(1, run.get("tables", 1)))
        if "failed" in run:
            rows.append((f"{label}: run --until-idle", "FAILED", run["failed"]))
        else:
            rows.append((f"{label}: run --until-idle wall", f"{run['wall_s']:.1f} s",
                         f"{run['changes'] / run['wall_s']:,.0f} changes/s; launch -> first commit "
                         f"{run.get('first_commit_s', float('nan')):.1f} s, last commit -> exit "
                         f"{run['wall_s'] - run.get('last_commit_s', float('nan')):.1f} s"))
        rows.append((f"{label}: peak RSS (process tree)", f"{run['rss_mib']:,.0f} MiB", _where(run)))
        check = run["check"]
        rows.append((f"{label}: tables = replay", f"{check['bad_tables']} mismatching table(s), "
                     f"{check['bad_rows']} row(s)", f"{check['tables']} table(s), {check['rows']:,} live rows"))
    fresh = results.get("freshness")
    if fresh:
        source = "`databases:`" if fresh.get("source", "database") == "database" else "`pipelines:` per table"
        label = f"freshness, {source}, {fresh.get('tables', '?')} tables, {fresh['rate']:,.0f} changes/s"
        if "failed" in fresh:
            rows.append((label, "FAILED", fresh["failed"]))
        elif fresh.get("drained"):
            rows.append((f"{label} for {fresh['seconds']:.0f} s", f"p50 {fresh['p50']:.1f} s, p95 {fresh['p95']:.1f} s",
                         f"max {fresh['max']:.1f} s; produced {fresh['produced_rate']:,.0f}/s, {fresh['events']:,} "
                         f"changes; caught up {fresh['drain_s']:.0f} s after the producer ended; the first input was "
                         f"in every table {fresh['ready_s']:.0f} s after launch"))
        else:
            rows.append((f"{label} for {fresh['seconds']:.0f} s", "did not catch up",
                         f"within {results['args']['drain_seconds']:.0f} s after the producer"))
        if "rss_mib" in fresh:
            steady = {k[len("steady_"):]: v for k, v in fresh.items() if k.startswith("steady_")}
            rows.append(("freshness: peak RSS (process tree)", f"{fresh['rss_mib']:,.0f} MiB",
                         _where(steady) + (" (steady phase)" if steady.get("log_merges") else "")))
        if "check" in fresh:
            check = fresh["check"]
            rows.append(("freshness: tables = replay", f"{check['bad_tables']} mismatching table(s), "
                         f"{check['bad_rows']} row(s)", f"{check['tables']} tables, {check['rows']:,} live rows"))
    return rows


def print_table(results: dict) -> None:
    print(f"\nload at start: {results['load_start']['uptime']}")
    print(f"load at end:   {results.get('load_end', {}).get('uptime', '-')}\n")
    print("| what | figure | note |")
    print("|---|---|---|")
    for what, figure, note in rows_of(results):
        print(f"| {what} | {figure} | {note} |")


def attempt(results: dict, name: str, step) -> None:
    """results[name] = step(), or {'failed': why} (the run goes on)."""
    try:
        results[name] = step()
    except SystemExit as failure:
        lines = [line for line in str(failure).splitlines() if line.strip()]
        results[name] = {**results.get(name, {}), "failed": (lines or ["?"])[0][:300]}
        print(f"  {name}: FAILED {results[name]['failed']}", flush=True)


def database_available() -> bool:
    """Does this checkout's config take `databases:`?"""
    from service.config.settings import Settings

    return "databases" in Settings.model_fields


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results: dict = {"load_start": load(), "args": vars(args)}
    if not database_available():
        dropped = ["database"] + (["freshness"] if args.freshness_with == "database" else [])
        if set(dropped) & set(args.sections):
            print(f"NOTE: this checkout has no `databases:` source; left out: {', '.join(dropped)}", flush=True)
        args.sections = [s for s in args.sections if s not in dropped]
    per_table, keys_per_table = args.changes // args.tables, args.keys // args.tables
    with tempfile.TemporaryDirectory(prefix="cdc-dbbench-") as tmp:
        work = Path(args.workdir) if args.workdir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        with broker(args.bootstrap, work) as bootstrap:
            clock = Clock()
            print(f"broker {bootstrap}; {args.tables} tables x {per_table:,} changes, {args.partitions} partitions; "
                  f"work dir {work}", flush=True)
            if "single" in args.sections:
                single = TableWorkload(SINGLE_TOPIC, "t000", args.partitions, args.keys, clock, random.Random(args.seed))
                produced, seconds = produce_workloads(bootstrap, [single], args.changes, args.partitions)
                print(f"single: {produced:,} records ({args.changes:,} changes, {produced - args.changes:,} "
                      f"tombstones) produced in "
                      f"{seconds:.1f} s; {len(single.rows):,} live keys", flush=True)
                config = {**base_config(work / "single", bootstrap), "pipelines": [pipeline_block(SINGLE_TOPIC, SINGLE_TABLE)]}
                attempt(results, "single", lambda: service_section(
                    "single", work / "single", config, {SINGLE_TABLE: single}, args.changes, args.timeout))
                save(results, args.json)
            many = {f"public_{t}": TableWorkload(f"bench.public.{t}", t, args.partitions, keys_per_table, clock,
                                                 random.Random(args.seed * 1000 + i))
                    for i, t in enumerate(table_names(args.tables))}
            if {"database", "pipelines"} & set(args.sections):
                produced, seconds = produce_workloads(bootstrap, list(many.values()), per_table, args.partitions)
                print(f"{args.tables} topics: {produced:,} records ({per_table * args.tables:,} changes, "
                      f"{produced - per_table * args.tables:,} tombstones) produced in {seconds:.1f} s; "
                      f"{sum(len(w.rows) for w in many.values()):,} live keys", flush=True)
            for name in ("database", "pipelines"):
                if name not in args.sections:
                    continue
                config = base_config(work / name, bootstrap)
                if name == "database":
                    config["databases"] = [database_block(args.database_option)]
                else:
                    config["pipelines"] = [pipeline_block(w.topic, table) for table, w in many.items()]
                attempt(results, name, lambda name=name, config=config: service_section(
                    name, work / name, config, many, per_table * args.tables, args.timeout))
                results[name]["tables"] = args.tables
                save(results, args.json)
            if "freshness" in args.sections:
                where = work / args.freshness_with
                config = base_config(where, bootstrap)
                if args.freshness_with == "database":
                    config["databases"] = [database_block(args.database_option)]
                else:
                    config["pipelines"] = [pipeline_block(w.topic, table) for table, w in many.items()]
                attempt(results, "freshness", lambda: freshness_section(args, bootstrap, where, config, many))
                results["freshness"].update(tables=args.tables, source=args.freshness_with)
    results["load_end"] = load()
    save(results, args.json)
    print_table(results)


def save(results: dict, path: str | None) -> None:
    if path:
        Path(path).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
