"""What a real change capture must yield, checked the same way whichever Debezium captured it (the
embedded engine, tests/e2e/test_real_capture.py; a Kafka Connect worker, test_connect_capture.py).

A test module runs the workload of tests/support/capture/workload.py through its Debezium into Kafka, then
`ingest` (one `cdc-lakehouse run --until-idle`) into Delta, and provides the result as the module
fixture `captured` (a `Capture`); it imports the `test_*` functions below, which pytest collects
there and runs against that module's fixture.

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
The marker table only tells the capture when to stop; it is not ingested.

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

from tests.support.capture.postgres import PostgresCluster
from tests.support.capture.workload import (
    MARKER_TABLE,
    SCHEMA,
    SNAPSHOT_ROWS,
    TABLES,
    TABLES_BY_NAME,
)
from tests.support.pipeline_harness import run_cli, write_config

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
    produced: dict[str, int]  # topic -> records the capture produced
    tables_root: Path
    timings: dict[str, float] = field(default_factory=dict)


def phase(timings: dict[str, float], name: str, started: float) -> float:
    """Record the seconds since `started` as phase `name`; now, to start the next phase."""
    now = time.monotonic()
    timings[name] = round(now - started, 2)
    return now


def run_sql(cluster: PostgresCluster, workdir: Path, name: str, sql: str, dbname: str) -> None:
    """Run `sql` as the script `workdir/<name>.sql` with psql."""
    path = workdir / f"{name}.sql"
    path.write_text(sql)
    cluster.run_file(path, dbname)


PIPELINE_OPTIONS = {
    "tags": {"upsert_key": [], "upsert_materialize": "none", "max_offsets_per_trigger": 100,
             "from_changelog": {"preset": "debezium", "truncate_handling": "truncate"}},
    "documents": {"max_offsets_per_trigger": 25},
}


def _pipelines(capture: Capture) -> list[dict]:
    return [{"name": f"rc_{t.name}", "topics": [capture.topics[t.name]], "table": t.name,
             "primary_key": list(t.sink_key), **PIPELINE_OPTIONS.get(t.name, {})} for t in INGESTED]


def ingest(capture: Capture, bootstrap: str, workdir: Path, extra: list[dict] | None = None) -> None:
    """One pipeline per ingested table (and the `extra` ones), one `cdc-lakehouse run --until-idle`; it
    must exit 0."""
    config = write_config(workdir / "config.yaml", bootstrap, workdir, _pipelines(capture) + (extra or []))
    started = time.monotonic()
    result = run_cli(config, "--until-idle")
    phase(capture.timings, "cdc-lakehouse run --until-idle", started)
    print(f"capture timings (s): {capture.timings}; records per topic: {capture.produced}")
    assert result.returncode == 0, result.stderr[-3000:]


def records(bootstrap: str, topic: str) -> list[tuple[bytes | None, dict | None, dict[str, bytes]]]:
    """(key, payload, headers) of every record of a one-partition topic (JSON with schemas)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"rc-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    try:
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, 0)])
        found = []
        while len(found) < end:
            message = consumer.poll(10)
            assert message is not None and message.error() is None, f"{topic}: read stopped at {len(found)}"
            payload = orjson.loads(message.value())["payload"] if message.value() is not None else None
            found.append((message.key(), payload, dict(message.headers() or [])))
        return found
    finally:
        consumer.close()


def test_capture_holds_every_case_of_the_workload(captured: Capture, kafka_bootstrap: str):
    by_table = {table: records(kafka_bootstrap, topic) for table, topic in captured.topics.items()}
    assert {captured.topics[t]: len(r) for t, r in by_table.items()} == captured.produced
    ops = {table: Counter(p["op"] if p else "tombstone" for _, p, _ in rs) for table, rs in by_table.items()}
    assert sum(o["r"] for o in ops.values()) == sum(SNAPSHOT_ROWS.values()) + 1 >= 1_000
    assert sum(o["c"] + o["u"] + o["d"] for o in ops.values()) >= 2_000
    assert by_table[MARKER_TABLE][-1][1]["after"] == {"id": 1, "note": "end of workload"}
    for table in ("customers", "orders"):  # primary-key changes: d under the old key, c under the new
        assert any("__debezium.newkey" in h for _, p, h in by_table[table] if p and p["op"] == "d"), table
        assert any("__debezium.oldkey" in h for _, p, h in by_table[table] if p and p["op"] == "c"), table
    assert all(p["before"] for _, p, _ in by_table["orders"] if p and p["op"] == "u")  # REPLICA IDENTITY FULL
    assert all(key is None for key, _, _ in by_table["tags"]) and ops["tags"]["u"] > 0
    assert ops["tags"]["t"] == 1 and sum(o["t"] for o in ops.values()) == 1
    assert any(p["after"]["body"] == UNAVAILABLE for _, p, _ in by_table["documents"] if p and p["op"] == "u")


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


def compare(captured: Capture, cluster: PostgresCluster, table: str, columns: tuple[str, ...] | None,
            delta_table: str | None = None) -> None:
    """The Delta table (`delta_table`, else the source table's name) equals `SELECT *` of `table` in `columns`."""
    source_table = TABLES_BY_NAME[table]
    names, expected = _source(cluster, captured.dbname, table)
    schema, actual = _delta(captured.tables_root, delta_table or table)
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
def test_delta_table_equals_select_star(captured: Capture, postgres: PostgresCluster, table: str,
                                        columns: tuple[str, ...] | None):
    compare(captured, postgres, table, columns)


@pytest.mark.parametrize("table", [t.name for t in INGESTED])
def test_delta_column_types_follow_postgres(captured: Capture, postgres: PostgresCluster, table: str):
    expected = {name: _arrow_type(sql) for name, sql in _source_types(postgres, captured.dbname, table).items()}
    schema, _ = _delta(captured.tables_root, table)
    assert {f.name: pa.string() if f.type in STRING_READS else f.type for f in schema} == expected
