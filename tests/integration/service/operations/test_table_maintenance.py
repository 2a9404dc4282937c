"""Table maintenance on real Delta tables, alone and next to a running export, with both engines:
delta-rs, and delta-spark in the test run's Spark session (Delta's own OPTIMIZE, checkpoint, log
cleanup and VACUUM). Tables are read back with delta-rs, delta-spark's also with Spark's reader."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from prometheus_client import REGISTRY

from connectors.delta.delta_rs import DELETE_FLAG, DeltaRsTable
from connectors.delta.engines import EngineTable, open_table
from connectors.kafka.cluster import ClusterView
from service.config.settings import Settings, settings_from_mapping
from service.delta_to_kafka.export_position import DEFAULT_POSITIONS_TOPIC
from service.delta_to_kafka.pipeline import ExportPipeline
from service.operations.maintenance import StepResult, TableMaintenance
from service.operations.status import export_status
from service.operations.workload import DebeziumWorkload, create_topics, produce
from service.supervisor.runner import Runner
from tests.support.export_driver import consume, json_records

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("batch", pa.int64())])
PER_BATCH = 10


ENGINES = ["delta-rs", "delta-spark"]


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return request.param


def _settings(workdir: Path, unique: str, bootstrap: str = "127.0.0.1:9", exports: bool = False,
              engine: str = "delta-rs") -> Settings:
    export = {"name": f"exp-{unique}", "table": "orders", "topic": f"out-{unique}", "primary_key": ["id"]}
    return settings_from_mapping({
        "kafka": {"bootstrap_servers": bootstrap},
        "lakehouse": {"root": str(workdir / "tables"), "engine": engine},
        "checkpoint_root": str(workdir / "checkpoints"),
        "maintenance": {"every_batches": 3, "every_seconds": None, "vacuum_retention_hours": 0},
        "pipelines": [{"name": f"in-{unique}", "topics": ["orders"], "table": "orders", "primary_key": ["id"]}],
        "exports": [export] if exports else [],
    })


def _table(settings: Settings, spark) -> EngineTable:
    """The test table, written by the settings' engine (delta-spark in the test run's session)."""
    lakehouse = settings.lakehouse
    return open_table(lakehouse.engine, lakehouse.table_uri("orders"), None, spark)


def _append(table: EngineTable, rows: pa.Table, spark) -> None:
    """A plain append by the table's engine (no MERGE)."""
    if isinstance(table, DeltaRsTable):
        write_deltalake(table.uri, rows, mode="append")
    else:
        spark.createDataFrame(rows).write.format("delta").mode("append").save(table.uri)


BATCHES = 9
"""Batches of the concurrent export test."""


def _merge_batch(table: EngineTable, batch: int, spark=None) -> list[tuple[int, str]]:
    """Batch `batch`: 10 new keys; every third batch also updates 3 keys of the previous batch and
    deletes its last key (the engine rewrites the files it matches, so the other batches add small
    files). Every third batch is a plain append: its change feed is read from its data file, which
    compaction removes and VACUUM then deletes (a MERGE's feed is in `_change_data`).

    Returns the change feed rows it must produce: (id, change type)."""
    new = list(range(batch * PER_BATCH, (batch + 1) * PER_BATCH))
    if batch % 3 == 1:
        rows = pa.table({"id": pa.array(new, pa.int64()), "name": [f"n{key}-{batch}" for key in new],
                         "batch": pa.array([batch] * len(new), pa.int64())}, schema=SCHEMA)
        _append(table, rows, spark)
        return [(key, "insert") for key in new]
    previous = list(range((batch - 1) * PER_BATCH, batch * PER_BATCH)) if batch % 3 == 2 else []
    updated, deleted = previous[:3], previous[-1:]
    ids = new + updated + deleted
    flags = [key in deleted for key in ids]
    changes = pa.table({
        "id": pa.array(ids, pa.int64()),
        "name": pa.array([None if gone else f"n{key}-{batch}" for key, gone in zip(ids, flags)], pa.string()),
        "batch": pa.array([None if gone else batch for gone in flags], pa.int64()),
        DELETE_FLAG: pa.array(flags, pa.bool_()),
    })
    table.merge(changes, ("id",), "maintenance-test", batch)
    return ([(key, "insert") for key in new] + [(key, kind) for key in updated
            for kind in ("update_preimage", "update_postimage")] + [(key, "delete") for key in deleted])


def _step(results: list[StepResult], name: str) -> StepResult:
    return next(result for result in results if result.step == name)


def _files(uri: str) -> int:
    return len(DeltaTable(uri).file_uris())


def _read(uri: str) -> pa.Table:
    return DeltaTable(uri).to_pyarrow_table().sort_by("id")


def _read_by_spark(spark, uri: str) -> list[dict]:
    return [row.asDict() for row in spark.read.format("delta").load(uri).orderBy("id").collect()]


def test_compaction_reduces_files_and_the_table_reads_back_identical(spark, engine, workdir, unique):
    settings = _settings(workdir, unique, engine=engine)
    uri = settings.lakehouse.table_uri("orders")
    table = _table(settings, spark)
    table.create(SCHEMA)
    for batch in range(8 if engine == "delta-rs" else 4):  # delta-spark: a few seconds a MERGE
        _merge_batch(table, batch, spark)
    before, files_before = _read(uri), _files(uri)
    by_spark = _read_by_spark(spark, uri)
    vacuumed = REGISTRY.get_sample_value("cdc_maintenance_files_removed_total",
                                         {"pipeline": f"in-{unique}", "step": "vacuum"}) or 0

    results = TableMaintenance(settings, settings.pipelines[0], spark=spark).run()

    assert [r.result for r in results] == ["done"] * 4, results
    assert files_before > 1 and _files(uri) == 1
    assert _step(results, "compact").files_removed == files_before
    assert _read(uri).equals(before) and _read_by_spark(spark, uri) == by_spark == before.to_pylist()
    deleted = _step(results, "vacuum").files_removed
    assert deleted >= files_before and len(list(Path(uri).glob("*.parquet"))) == 1
    assert REGISTRY.get_sample_value("cdc_maintenance_files_removed_total",
                                     {"pipeline": f"in-{unique}", "step": "vacuum"}) == vacuumed + deleted
    assert list(Path(uri, "_delta_log").glob("*.checkpoint.parquet"))


def test_z_order_by_the_primary_key_rewrites_the_files_and_the_table_reads_back_identical(
        spark, engine, workdir, unique):
    settings = _settings(workdir, unique, engine=engine)
    settings = settings.model_copy(update={"maintenance": settings.maintenance.model_copy(update={"z_order": True})})
    uri = settings.lakehouse.table_uri("orders")
    table = _table(settings, spark)
    table.create(SCHEMA)
    for batch in range(5 if engine == "delta-rs" else 3):
        _merge_batch(table, batch, spark)
    before, files_before = _read(uri), _files(uri)

    results = TableMaintenance(settings, settings.pipelines[0], spark=spark).run()

    assert _step(results, "compact").result == "done" and _step(results, "compact").files_removed == files_before
    (optimized,) = [commit for commit in DeltaTable(uri).history() if commit["operation"] == "OPTIMIZE"]
    if engine == "delta-rs":
        assert optimized["operationMetrics"]["plannerStrategy"] == "zOrder"
    else:
        assert json.loads(optimized["operationParameters"]["zOrderBy"]) == ["id"]
    assert _files(uri) == 1 and _read(uri).equals(before) and _read_by_spark(spark, uri) == before.to_pylist()


def _read_up_to(settings: Settings) -> int:
    """The last version both the export's position in Kafka and its checkpoint have passed."""
    cluster = ClusterView(settings.kafka.client_config())
    try:
        status = export_status(settings, settings.exports[0], cluster)
    finally:
        cluster.close()
    return min(-1 if version is None else version for version in (status.published_version, status.checkpoint_version))


def _await_caught_up(settings: Settings, table: EngineTable, query, timeout_s: float = 180.0) -> None:
    """Return once the export has published and checkpointed the table's current version."""
    target = table.version()
    deadline = time.monotonic() + timeout_s
    while _read_up_to(settings) < target:
        assert query.isActive, query.exception()
        assert time.monotonic() < deadline, f"export not at version {target} within {timeout_s}s"
        time.sleep(0.2)


@pytest.mark.slow
def test_an_export_running_concurrently_with_maintenance_and_vacuum_loses_nothing(
        spark, engine, kafka_bootstrap, workdir, unique):
    """Nine batches (one delete in every third): maintenance runs after batch 5 while the export is
    still reading (VACUUM is refused while it has versions left to read) and after batch 8 once it
    caught up (VACUUM deletes what compaction removed)."""
    settings = _settings(workdir, unique, kafka_bootstrap, exports=True, engine=engine)
    export = settings.exports[0]
    uri = settings.lakehouse.table_uri("orders")
    create_topics(kafka_bootstrap, [export.topic], 1)
    table = _table(settings, spark)
    table.create(SCHEMA)
    maintenance = TableMaintenance(settings, settings.pipelines[0], spark=spark)
    expected: list[tuple[int, str, int]] = []

    def merge(batch: int) -> None:
        changes = _merge_batch(table, batch, spark)
        expected.extend((key, kind, table.version()) for key, kind in changes)

    for batch in range(3):
        merge(batch)
    # The export has read nothing yet: VACUUM with a zero retention would delete its change feed.
    refused = _step(maintenance.run(), "vacuum")
    assert refused.result == "refused"
    assert f"VACUUM of table {uri} refused: export {export.name} has not read the change feed from version 0" \
        in refused.detail

    pipeline = ExportPipeline(
        spark, export.name, uri, export.topic, settings.kafka.client_config(), settings.checkpoint_dir(export.name),
        json_records, positions_topic=DEFAULT_POSITIONS_TOPIC, max_versions_per_trigger=2,
        trigger_interval_seconds=0.2,
    )
    query = pipeline.start(until_idle=False)
    runs: list[list[StepResult]] = []
    try:
        for batch in range(3, BATCHES):
            merge(batch)
            if batch == BATCHES - 1:  # the export catches up first: nothing unread, so VACUUM runs
                _await_caught_up(settings, table, query)
            runs.append(maintenance.after_batch())  # every 3 batches: 5 and 8
            if batch == BATCHES - 1:
                assert _step(runs[-1], "vacuum").result == "done", runs[-1]
        _await_caught_up(settings, table, query)
    finally:
        query.stop()
        pipeline.close()
    assert query.exception() is None

    steps = [result for run in runs for result in run]
    assert sum(r.files_removed for r in steps if r.step == "vacuum" and r.result == "done") > 0
    assert sum(r.files_removed for r in steps if r.step == "compact") > 0
    published = Counter()
    for key, value, _ in consume(kafka_bootstrap, export.topic):
        document = json.loads(value)
        published[(int(key), document["change"], document["version"])] += 1
    assert published == Counter(expected)  # every change exactly once, none lost
    final = _read(uri)
    assert final.num_rows == BATCHES * PER_BATCH - BATCHES // 3 and set(final.column("batch").to_pylist()) == set(range(BATCHES))
    assert _read_by_spark(spark, uri) == final.to_pylist()


@pytest.mark.slow
def test_the_ingest_pipeline_maintains_its_table_between_micro_batches(spark, engine, kafka_bootstrap, unique,
                                                                       workdir):
    workload = DebeziumWorkload(f"maintained-{unique}", 2, "never", seed=5)
    create_topics(kafka_bootstrap, [workload.topic], 2)
    produce(kafka_bootstrap, workload.generate(600, 150))  # 4 or 5 batches of 150: maintenance after 2 and 4
    name = f"in-{unique}"
    settings = settings_from_mapping({
        "kafka": {"bootstrap_servers": kafka_bootstrap},
        "lakehouse": {"root": str(workdir / "tables"), "engine": engine},
        "checkpoint_root": str(workdir / "checkpoints"),
        "maintenance": {"every_batches": 2, "every_seconds": None, "vacuum_retention_hours": 0},
        "pipelines": [{"name": name, "topics": [workload.topic], "table": "t", "primary_key": ["id"],
                       "max_offsets_per_trigger": 150}],
    })
    runner = Runner(settings)
    runner.start(until_idle=True)
    runner.wait()
    assert runner.pipelines[0].committed_batches >= 4
    for step in ("compact", "checkpoint", "log_cleanup", "vacuum"):
        assert (REGISTRY.get_sample_value("cdc_maintenance_runs_total",
                                          {"pipeline": name, "step": step, "result": "done"}) or 0) >= 2, step
    assert REGISTRY.get_sample_value("cdc_maintenance_files_removed_total", {"pipeline": name, "step": "vacuum"}) > 0
    uri = settings.lakehouse.table_uri("t")
    assert sorted(DeltaTable(uri).to_pyarrow_table().to_pylist(), key=lambda r: r["id"]) == workload.expected_rows()
    assert [{k: v for k, v in row.items() if k in workload.expected_rows()[0]} for row in _read_by_spark(spark, uri)] \
        == workload.expected_rows()
