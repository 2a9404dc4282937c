"""Source schema changes through a real capture: PostgreSQL -> the Debezium engine -> Kafka ->
`cdc-lakehouse run --until-idle` -> Delta, per `schema_changes` policy.

One table, `items (id integer PRIMARY KEY, qty integer, amount numeric(8,2), label text, gone text)`,
captured once (module fixture `captured`) in two phases with one `--until-idle` run between them:

1. snapshot rows and a few streamed changes; every pipeline (`lenient`, `evolve`, `fail`) ingests them;
2. `ADD COLUMN note text DEFAULT 'dflt'`, `DROP COLUMN gone`, `ALTER COLUMN qty TYPE bigint`, `ALTER
   COLUMN amount TYPE numeric(12,2)`, `RENAME COLUMN label TO title`, then every row updated (Debezium
   PostgreSQL sends no event for a DDL statement: rows not changed since would hold null in the added
   and renamed columns), a qty above 2^31 and an amount of 12 digits, a delete.

Then `lenient` and `evolve` run again (exit 0): their tables equal `SELECT *` of the source for every
column the source has, with its types (bigint, numeric(12,2)); the dropped and renamed-away columns
stay, null in every row rewritten since. A `lenient` pipeline written by delta-spark runs the same
way (its own runs; its table read back with delta-rs, as exports read it), and so does a database
source over the capture's topics (in the same runs as the delta-rs pipelines, primary key from the
Kafka key, table `items_db`).
`fail` runs alone and stops (exit 1) naming the column.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from service.operations.workload import create_topics
from tests.support.capture.debezium_engine import EngineProcess, debezium_properties
from tests.support.capture.postgres import (  # noqa: F401 - the session fixture
    PostgresCluster,
    postgres,
)
from tests.support.pipeline_harness import run_cli, write_config

pytestmark = pytest.mark.slow
SCHEMA, TABLE, MARKER = "public", "items", "sc_marker"
BIG_QTY = 2**31 + 5
CREATE = f"""
CREATE TABLE {TABLE} (id integer PRIMARY KEY, qty integer, amount numeric(8,2), label text, gone text);
CREATE TABLE {MARKER} (id integer PRIMARY KEY);
INSERT INTO {TABLE} VALUES (1, 10, 1.50, 'a', 'g1'), (2, 20, 2.50, 'b', 'g2'), (3, 30, 3.50, 'c', 'g3'),
                           (4, 40, 4.50, 'd', 'g4'), (5, 50, 5.50, 'e', 'g5');
"""
PHASE_1 = f"""
UPDATE {TABLE} SET qty = 21, label = 'b2' WHERE id = 2;
INSERT INTO {TABLE} VALUES (6, 60, 123456.78, 'f', 'g6');
INSERT INTO {MARKER} VALUES (1);
"""
PHASE_2 = f"""
ALTER TABLE {TABLE} ADD COLUMN note text DEFAULT 'dflt';
ALTER TABLE {TABLE} DROP COLUMN gone;
ALTER TABLE {TABLE} ALTER COLUMN qty TYPE bigint;
ALTER TABLE {TABLE} ALTER COLUMN amount TYPE numeric(12,2);
ALTER TABLE {TABLE} RENAME COLUMN label TO title;
UPDATE {TABLE} SET qty = qty;
INSERT INTO {TABLE} (id, qty, amount, title, note) VALUES (7, {BIG_QTY}, 1234567890.12, 'g', 'seven');
UPDATE {TABLE} SET qty = 3000000000, amount = 9999999999.99, note = 'big' WHERE id = 3;
DELETE FROM {TABLE} WHERE id = 5;
INSERT INTO {MARKER} VALUES (2);
"""
SOURCE_TYPES = {"id": pa.int32(), "qty": pa.int64(), "amount": pa.decimal128(12, 2), "title": pa.string(),
                "note": pa.string()}
GONE = ("label", "gone")
POLICIES = ("lenient", "evolve")
SPARK = "spark_lenient"
"""The pipeline written by delta-spark (its own runs): `lenient`, table `items_spark_lenient`."""
DATABASE = "db"
"""A database source over the capture's topics (in the delta-rs pipelines' runs; `lenient`, the default): table `items_db`."""
STRING_READS = (pa.large_string(), pa.string_view())


@dataclass
class Captured:
    """The source database and what each run did."""

    dbname: str
    workdir: Path
    after_phase_1: dict[str, list[dict]]  # policy -> Delta rows after the first run
    source_after_phase_1: list[dict]
    second: dict[str, object]  # "lenient+evolve" / "fail" -> the CompletedProcess of that run


def _pipelines(topic: str, names: tuple[str, ...]) -> list[dict]:
    return [{"name": f"sc_{name}", "topics": [topic], "table": f"items_{name}", "primary_key": ["id"],
             "schema_changes": name.rsplit("_", 1)[-1]} for name in names]


def _ingest(workdir: Path, bootstrap: str, topic: str, names: tuple[str, ...], run: str, engine: str = "delta-rs",
            database_prefix: str | None = None):
    """One `--until-idle` run of the pipelines `names`, and of the database source over the capture's
    topics when `database_prefix` is given (the same service)."""
    extra = {}
    if database_prefix is not None:
        pattern = database_prefix.replace(".", r"\.") + r"\.(?P<schema>[^.]+)\.(?P<table>[^.]+)"
        extra["databases"] = [{"name": f"sc_{DATABASE}", "topic_pattern": pattern, "table_name": "{table}_" + DATABASE}]
    config = write_config(workdir / f"{run}.yaml", bootstrap, workdir, _pipelines(topic, names), engine=engine, **extra)
    return run_cli(config, "--until-idle")


def _run_sql(cluster: PostgresCluster, workdir: Path, name: str, sql: str, dbname: str) -> None:
    """`sql` with psql, each statement committed on its own."""
    path = workdir / f"{name}.sql"
    path.write_text(sql)
    cluster.run_file(path, dbname)


def _wait_produced(engine: EngineProcess, topic: str, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while engine.status().get("produced", {}).get(topic, 0) < count:
        assert time.monotonic() < deadline, f"engine status {engine.status()}"
        assert engine.process.poll() is None, engine.log.read_text(errors="replace")[-3000:]
        time.sleep(0.2)


def _source(cluster: PostgresCluster, dbname: str) -> tuple[list[str], list[dict]]:
    with psycopg.connect(cluster.conninfo(dbname)) as conn:
        cursor = conn.execute(f"SELECT * FROM {SCHEMA}.{TABLE} ORDER BY id")
        names = [column.name for column in cursor.description]
        return names, [dict(zip(names, row)) for row in cursor.fetchall()]


def _delta(workdir: Path, policy: str) -> pa.Table:
    return DeltaTable(str(workdir / "tables" / f"items_{policy}")).to_pyarrow_table().sort_by("id")


def _commit_info(commit: dict) -> dict:
    """A commit's own entries: delta-rs writes them into the commit info, delta-spark as its userMetadata."""
    return json.loads(commit["userMetadata"]) if commit.get("userMetadata") else commit


@pytest.fixture(scope="module")
def captured(postgres: PostgresCluster, kafka_bootstrap: str, tmp_path_factory) -> Captured:  # noqa: F811
    workdir = tmp_path_factory.mktemp("schema_changes_capture")
    unique = uuid.uuid4().hex[:8]
    dbname, prefix = f"sc_{unique}", f"sc{unique}"
    topic, marker = f"{prefix}.{SCHEMA}.{TABLE}", f"{prefix}.{SCHEMA}.{MARKER}"
    postgres.execute(f"CREATE DATABASE {dbname}", dbname="postgres")
    _run_sql(postgres, workdir, "create", CREATE, dbname)
    create_topics(kafka_bootstrap, [topic, marker], 1)
    properties = debezium_properties(name=f"sc_{unique}", port=postgres.port, dbname=dbname, prefix=prefix,
                                     tables=[f"{SCHEMA}.{TABLE}", f"{SCHEMA}.{MARKER}"], workdir=workdir)
    # The engine streams through the first runs of the service: its time limit covers them on a loaded machine.
    engine = EngineProcess(properties, kafka_bootstrap, workdir, marker, 2, max_seconds=1800).start()
    try:
        engine.wait_streaming()
        _run_sql(postgres, workdir, "phase_1", PHASE_1, dbname)
        _wait_produced(engine, marker, 1)
        for run in (_ingest(workdir, kafka_bootstrap, topic, (*POLICIES, "fail"), "first", database_prefix=prefix),
                    _ingest(workdir, kafka_bootstrap, topic, (SPARK,), "first_spark", "delta-spark")):
            assert run.returncode == 0, run.stderr[-3000:]
        after_phase_1 = {name: _delta(workdir, name).to_pylist() for name in (*POLICIES, SPARK, DATABASE, "fail")}
        source_after_phase_1 = _source(postgres, dbname)[1]
        _run_sql(postgres, workdir, "phase_2", PHASE_2, dbname)
        engine.wait_captured()
    finally:
        engine.stop()
        postgres.drop_replication_slot(properties["slot.name"])
    both = _ingest(workdir, kafka_bootstrap, topic, POLICIES, "second", database_prefix=prefix)
    second = {"lenient+evolve": both, DATABASE: both,
              SPARK: _ingest(workdir, kafka_bootstrap, topic, (SPARK,), "second_spark", "delta-spark"),
              "fail": _ingest(workdir, kafka_bootstrap, topic, ("fail",), "third")}
    return Captured(dbname, workdir, after_phase_1, source_after_phase_1, second)


@pytest.mark.parametrize("policy", [*POLICIES, SPARK, DATABASE, "fail"])
def test_before_the_changes_every_table_equals_select_star(captured: Captured, policy: str):
    assert captured.after_phase_1[policy] == captured.source_after_phase_1
    assert captured.source_after_phase_1[5] == {"id": 6, "qty": 60, "amount": Decimal("123456.78"), "label": "f",
                                                "gone": "g6"}


@pytest.mark.parametrize("policy", [*POLICIES, SPARK, DATABASE])
def test_after_the_changes_the_table_equals_select_star_for_the_columns_the_source_has(
        captured: Captured, postgres: PostgresCluster, policy: str):  # noqa: F811
    run = captured.second[policy if policy in (SPARK, DATABASE) else "lenient+evolve"]
    assert run.returncode == 0, run.stderr[-3000:]
    names, expected = _source(postgres, captured.dbname)
    assert names == list(SOURCE_TYPES)
    delta = _delta(captured.workdir, policy)
    # The new columns come after the old ones, in an order the engine's schema merge chooses.
    assert delta.column_names[:5] == ["id", "qty", "amount", *GONE] and set(delta.column_names[5:]) == {"title", "note"}
    assert delta.select(names).to_pylist() == expected
    assert {row["id"]: (row["qty"], row["amount"]) for row in expected}[7] == (BIG_QTY, Decimal("1234567890.12"))
    types = {f.name: pa.string() if f.type in STRING_READS else f.type for f in delta.schema}
    assert {name: types[name] for name in names} == SOURCE_TYPES
    # Every row left was rewritten after the drop and the rename: the old columns stay, null.
    assert delta.select(list(GONE)).to_pylist() == [{"label": None, "gone": None}] * len(expected)
    history = DeltaTable(str(captured.workdir / "tables" / f"items_{policy}")).history()
    widened = [json.loads(info["cdc.widened"]) for info in map(_commit_info, history) if "cdc.widened" in info]
    assert widened == [{"qty": "int64", "amount": "decimal128(12, 2)"}]  # one rewrite, before the batch's MERGE


def test_fail_stops_naming_the_column(captured: Captured):
    run = captured.second["fail"]
    assert run.returncode == 1, run.stderr[-3000:]
    assert "column 'qty' has type int64 in this batch but int32 in the table" in run.stderr, run.stderr[-3000:]
    assert "schema_changes: fail" in run.stderr
    assert _delta(captured.workdir, "fail").to_pylist() == captured.after_phase_1["fail"]
