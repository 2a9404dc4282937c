"""A real change capture end to end: PostgreSQL -> the Debezium engine -> Kafka -> `cdc-lakehouse run
--until-idle` -> Delta; every Delta table equals `SELECT *` of its source table, column for column.

The capture runs once per module (fixture `captured`): tables and snapshot rows, the engine
started and streaming, the mixed workload (tests/capture/workload.py), a marker row last, the
engine stopped once it captured the marker (the marker table only signals the end and is not
ingested), then one pipeline per table and one `--until-idle` run.

Pipelines beyond the defaults (`PIPELINE_OPTIONS`):
- `tags` has no primary key: retract mode. Its upsert key is the whole row and its sink key every
  column, so an update's before image (REPLICA IDENTITY FULL) deletes the old row and its after
  image inserts the new one. The sink key is the whole row too, so two live rows can never claim
  one key: the plain per-batch reduction is exact and the materializer is not needed
  (`upsert_materialize: none`; `on_conflict` would never fire). Its TRUNCATE is applied
  (`truncate_handling: truncate`); small batches put it after rows already stored in Delta, so the
  MERGE that carries it deletes them.
- `documents` runs in small batches too, so an unchanged TOAST value is sometimes stored in an
  earlier batch (the MERGE keeps it) and sometimes only earlier in the same batch.

Column names and their order must match; column types must be the Arrow types of `PG_TO_ARROW`.

Normalisation before comparing, of representation only:
- timestamptz: psycopg returns the server zone's wall time (the cluster runs in America/New_York),
  Delta returns timestamp[us, UTC]: both are compared as UTC datetimes (the same instant);
- Delta string columns may be read as large_string / string_view: compared as string;
- rows are compared as sets keyed by the sink primary key (neither side has an order).
numeric(10,2) (Decimal), date, timestamp (naive datetime), int, bigint, boolean, text and varchar
are compared as they come from psycopg and from deltalake, unchanged.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import orjson
import psycopg
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from deltalake import DeltaTable

from service.workload import create_topics
from tests.capture.debezium_engine import EngineProcess, debezium_properties
from tests.capture.postgres import PostgresCluster, postgres  # noqa: F401 - the session fixture
from tests.capture.workload import MARKER_RECORDS, MARKER_TABLE, SCHEMA, SNAPSHOT_ROWS, TABLES, TABLES_BY_NAME, Workload
from tests.pipeline_harness import run_cli, write_config

pytestmark = pytest.mark.slow
# The marker table only tells the engine when to stop; it is not ingested.
INGESTED = tuple(t for t in TABLES if t.name != MARKER_TABLE)
UNAVAILABLE = "__debezium_unavailable_value"
PG_TO_ARROW = {
    "integer": pa.int32(), "bigint": pa.int64(), "numeric(10,2)": pa.decimal128(10, 2), "text": pa.string(),
    "boolean": pa.bool_(), "date": pa.date32(), "timestamp without time zone": pa.timestamp("us"),
    "timestamp with time zone": pa.timestamp("us", tz="UTC"),
}
STRING_READS = (pa.large_string(), pa.string_view())


@dataclass
class Capture:
    """What one capture produced and where it landed."""

    dbname: str
    topics: dict[str, str]  # table -> topic
    produced: dict[str, int]  # topic -> records the engine produced
    tables_root: Path
    timings: dict[str, float] = field(default_factory=dict)


def _phase(timings: dict[str, float], name: str, started: float) -> float:
    now = time.monotonic()
    timings[name] = round(now - started, 2)
    return now


def _run_sql(cluster: PostgresCluster, workdir: Path, name: str, sql: str, dbname: str) -> None:
    path = workdir / f"{name}.sql"
    path.write_text(sql)
    cluster.run_file(path, dbname)


def _capture(cluster: PostgresCluster, bootstrap: str, workdir: Path, timings: dict) -> Capture:
    unique = uuid.uuid4().hex[:8]
    dbname, prefix = f"rc_{unique}", f"rc{unique}"
    topics = {t.name: f"{prefix}.{SCHEMA}.{t.name}" for t in TABLES}
    workload, started = Workload(seed=11), time.monotonic()
    cluster.execute(f"CREATE DATABASE {dbname}", dbname="postgres")
    _run_sql(cluster, workdir, "snapshot", workload.schema_sql() + "\n" + workload.snapshot_sql(), dbname)
    create_topics(bootstrap, topics.values(), 1)  # one partition: keyless rows have no key to route by
    started = _phase(timings, "tables and snapshot rows", started)
    properties = debezium_properties(name=f"rc_{unique}", port=cluster.port, dbname=dbname, prefix=prefix,
                                     tables=[f"{SCHEMA}.{t.name}" for t in TABLES], workdir=workdir)
    engine = EngineProcess(properties, bootstrap, workdir, topics[MARKER_TABLE], MARKER_RECORDS).start()
    try:
        engine.wait_streaming()
        started = _phase(timings, "engine start to streaming", started)
        _run_sql(cluster, workdir, "streaming", workload.streaming_sql(), dbname)
        _run_sql(cluster, workdir, "marker", workload.marker_sql(), dbname)
        started = _phase(timings, "streaming workload (SQL)", started)
        produced = engine.wait_captured()
        _phase(timings, "capture drained, engine stopped", started)
    finally:
        engine.stop()
        cluster.drop_replication_slot(properties["slot.name"])
    return Capture(dbname, topics, produced, workdir / "tables", timings)


PIPELINE_OPTIONS = {
    "tags": {"upsert_key": [], "upsert_materialize": "none", "max_offsets_per_trigger": 100,
             "from_changelog": {"preset": "debezium", "truncate_handling": "truncate"}},
    "documents": {"max_offsets_per_trigger": 25},
}


def _pipelines(capture: Capture) -> list[dict]:
    return [{"name": f"rc_{t.name}", "topics": [capture.topics[t.name]], "table": t.name,
             "primary_key": list(t.sink_key), **PIPELINE_OPTIONS.get(t.name, {})} for t in INGESTED]


@pytest.fixture(scope="module")
def captured(postgres: PostgresCluster, kafka_bootstrap: str, tmp_path_factory) -> Capture:  # noqa: F811
    """The whole capture and one `--until-idle` ingest of it."""
    workdir = tmp_path_factory.mktemp("real_capture")
    timings: dict[str, float] = {}
    capture = _capture(postgres, kafka_bootstrap, workdir, timings)
    config = write_config(workdir / "config.yaml", kafka_bootstrap, workdir, _pipelines(capture))
    started = time.monotonic()
    result = run_cli(config, "--until-idle")
    _phase(timings, "cdc-lakehouse run --until-idle", started)
    print(f"real capture timings (s): {timings}; records per topic: {capture.produced}")
    assert result.returncode == 0, result.stderr[-3000:]
    return capture


def _records(bootstrap: str, topic: str) -> list[tuple[bytes | None, dict | None, dict[str, bytes]]]:
    """(key, payload, headers) of every record of a one-partition topic."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"rc-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    try:
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, 0)])
        records = []
        while len(records) < end:
            message = consumer.poll(10)
            assert message is not None and message.error() is None, f"{topic}: read stopped at {len(records)}"
            payload = orjson.loads(message.value())["payload"] if message.value() is not None else None
            records.append((message.key(), payload, dict(message.headers() or [])))
        return records
    finally:
        consumer.close()


def test_capture_holds_every_case_of_the_workload(captured: Capture, kafka_bootstrap: str):
    records = {table: _records(kafka_bootstrap, topic) for table, topic in captured.topics.items()}
    assert {captured.topics[t]: len(r) for t, r in records.items()} == captured.produced
    ops = {table: Counter(p["op"] if p else "tombstone" for _, p, _ in rs) for table, rs in records.items()}
    assert sum(o["r"] for o in ops.values()) == sum(SNAPSHOT_ROWS.values()) + 1 >= 1_000
    assert sum(o["c"] + o["u"] + o["d"] for o in ops.values()) >= 2_000
    assert records[MARKER_TABLE][-1][1]["after"] == {"id": 1, "note": "end of workload"}
    for table in ("customers", "orders"):  # primary-key changes: d under the old key, c under the new
        assert any("__debezium.newkey" in h for _, p, h in records[table] if p and p["op"] == "d"), table
        assert any("__debezium.oldkey" in h for _, p, h in records[table] if p and p["op"] == "c"), table
    assert all(p["before"] for _, p, _ in records["orders"] if p and p["op"] == "u")  # REPLICA IDENTITY FULL
    assert all(key is None for key, _, _ in records["tags"]) and ops["tags"]["u"] > 0
    assert ops["tags"]["t"] == 1 and sum(o["t"] for o in ops.values()) == 1
    assert any(p["after"]["body"] == UNAVAILABLE for _, p, _ in records["documents"] if p and p["op"] == "u")


def _truncating(commit: dict) -> bool:
    """A MERGE that deletes every stored row the batch does not upsert, or a DELETE of all rows (a
    batch ending with the truncate)."""
    merged = "delete" in commit["operationParameters"].get("notMatchedBySourcePredicates", "")
    return merged or commit["operation"] == "DELETE"


def test_the_truncate_deletes_rows_stored_by_earlier_batches(captured: Capture):
    history = DeltaTable(str(captured.tables_root / "tags")).history()
    truncating = [commit for commit in history if _truncating(commit)]
    assert len(truncating) == 1, [(c["operation"], c["operationParameters"]) for c in history]
    metrics = truncating[0]["operationMetrics"]
    # The first batch alone stored 100 snapshot rows; the batch holding the truncate comes later.
    assert metrics.get("num_target_rows_deleted", metrics.get("num_deleted_rows", 0)) >= 100, metrics


def _source_types(cluster: PostgresCluster, dbname: str, table: str) -> dict[str, str]:
    """Column -> SQL type, in table order."""
    return dict(cluster.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
        f"'{SCHEMA}.{table}'::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum", dbname=dbname))


def _source(cluster: PostgresCluster, dbname: str, table: str) -> tuple[list[str], list[dict]]:
    """(column names in order, rows) of `SELECT *`, timestamptz as UTC."""
    with psycopg.connect(cluster.conninfo(dbname)) as conn:
        cursor = conn.execute(f"SELECT * FROM {SCHEMA}.{table}")
        names = [column.name for column in cursor.description]
        return names, [dict(zip(names, map(_utc, row))) for row in cursor.fetchall()]


def _arrow_type(sql_type: str) -> pa.DataType:
    return pa.string() if sql_type.startswith("character varying") else PG_TO_ARROW[sql_type]


def _utc(value):
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(timezone.utc)
    return value


def _delta(root: Path, table: str) -> tuple[pa.Schema, list[dict]]:
    data = DeltaTable(str(root / table)).to_pyarrow_table()
    return data.schema, [{k: _utc(v) for k, v in row.items()} for row in data.to_pylist()]


def _differences(expected: list[dict], actual: list[dict], key: tuple[str, ...], columns: tuple[str, ...]) -> dict:
    """Rows missing / extra by key, and per column the number of rows whose values differ."""
    want = {tuple(row[c] for c in key): row for row in expected}
    got = {tuple(row[c] for c in key): row for row in actual}
    differing = [(k, c) for k in want.keys() & got.keys() for c in columns if want[k][c] != got[k][c]]
    found = {"missing rows": len(want.keys() - got.keys()), "extra rows": len(got.keys() - want.keys()),
             "duplicate keys in Delta": len(actual) - len(got),
             "differing values by column": dict(Counter(c for _, c in differing)),
             "first differing keys": sorted({k for k, _ in differing})[:3]}
    return {name: found for name, found in found.items() if found}


def _compare(captured: Capture, cluster: PostgresCluster, table: str, columns: tuple[str, ...] | None) -> None:
    source_table = TABLES_BY_NAME[table]
    names, expected = _source(cluster, captured.dbname, table)
    schema, actual = _delta(captured.tables_root, table)
    assert schema.names == names == list(source_table.columns)
    columns = columns or source_table.columns
    differences = _differences(expected, actual, source_table.sink_key, columns)
    assert differences == {}, f"{table} ({len(expected)} source rows, {len(actual)} Delta rows): {differences}"


@pytest.mark.parametrize(("table", "columns"), [
    pytest.param("customers", None, id="customers"),
    pytest.param("orders", None, id="orders-replica-identity-full"),
    pytest.param("tags", None, id="tags-without-primary-key-retract-mode"),
    pytest.param("documents", ("id", "title", "revision", "edited_at"), id="documents-all-but-toasted-body"),
    pytest.param("documents", ("id", "body"), id="documents-toasted-body-keeps-its-stored-value"),
])
def test_delta_table_equals_select_star(captured: Capture, postgres: PostgresCluster, table: str,  # noqa: F811
                                        columns: tuple[str, ...] | None):
    _compare(captured, postgres, table, columns)


@pytest.mark.parametrize("table", [t.name for t in INGESTED])
def test_delta_column_types_follow_postgres(captured: Capture, postgres: PostgresCluster, table: str):  # noqa: F811
    expected = {name: _arrow_type(sql) for name, sql in _source_types(postgres, captured.dbname, table).items()}
    schema, _ = _delta(captured.tables_root, table)
    assert {f.name: pa.string() if f.type in STRING_READS else f.type for f in schema} == expected
