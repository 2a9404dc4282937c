"""A pipeline's `columns:` through the MERGE sink on both Delta engines: include/exclude, a computed column,
a row filter an update moves rows out of and back into, a masked column whose raw value appears in no
file of the table; read back with the delta-rs reader and Spark's. Then one pipeline through Kafka, as the
service runs it."""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import date
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable

from service.config.settings import PipelineSettings, settings_from_mapping
from service.kafka_to_delta.materialize.payload import HISTORY_META, HISTORY_SEQUENCE
from service.kafka_to_delta.rows.names import Meta
from service.kafka_to_delta.sink import column_rules
from service.kafka_to_delta.sink.column_rules import (
    ColumnRules,
    ColumnRulesSink,
    collected,
    collected_by_job,
)
from service.kafka_to_delta.sink.merge_sink import MergeSink
from service.operations.workload import create_topics
from service.supervisor.runner import Runner
from vocabulary.changes import ChangeKind
from vocabulary.errors import ConfigError

APP = "columns-app"
SALT_ENV = "CDC_TEST_COLUMNS_SALT"
SALT = "pepper-7"
SCHEMA = pa.schema([("id", pa.int64()), ("email", pa.string()), ("country", pa.string()),
                    ("name", pa.string()), ("secret", pa.string())])
COLUMNS = {"exclude": ["secret"], "computed": {"domain": "split(email, '@')[1]", "tag": "upper(name)"},
           "filter": "country = 'DE'", "mask": {"email": "sha256"}, "salt_env": SALT_ENV}
UPSERT, DELETE = ChangeKind.UPDATE_AFTER, ChangeKind.DELETE


def _pipeline(columns: dict) -> PipelineSettings:
    return PipelineSettings(name="people", topics=["people"], table="people", primary_key=["id"], columns=columns)


def _typed(changes: list[tuple[ChangeKind, dict, list[str] | None]], first_offset: int) -> pa.Table:
    """Typed net changes as the plain path hands them to the sink (a delete's row holds its key alone)."""
    rows = [{name: row.get(name) for name in SCHEMA.names} for _, row, _ in changes]
    table = pa.Table.from_pylist(rows, SCHEMA)
    n = len(changes)
    meta = {
        Meta.KEY: pa.array([json.dumps([row["id"]]) for row in rows]),
        Meta.KIND: pa.array([kind.value for kind, _, _ in changes]),
        Meta.TOPIC: pa.array(["people"] * n), Meta.PARTITION: pa.array([0] * n, pa.int32()),
        Meta.OFFSET: pa.array(range(first_offset, first_offset + n), pa.int64()),
        Meta.CHANGE_INDEX: pa.array([0] * n, pa.int32()), Meta.TIMESTAMP: pa.array([0] * n, pa.int64()),
        Meta.UNCHANGED: pa.array([json.dumps(u) if u else None for _, _, u in changes], pa.string()),
    }
    for name in Meta.ALL:
        table = table.append_column(name, meta[name])
    return table


def _person(pid: int, country: str, name: str) -> dict:
    return {"id": pid, "email": f"{name}.{pid}@example.org", "country": country, "name": name,
            "secret": f"s3cret-{name}"}


def _hashed(value: str) -> str:
    return hashlib.sha256((SALT + value).encode()).hexdigest()


def _files_bytes(uri: str) -> bytes:
    return b"".join(path.read_bytes() for path in Path(uri).rglob("*") if path.is_file())


def test_columns_filter_compute_mask_and_project_on_both_engines(engine, tmp_path, spark, monkeypatch):
    monkeypatch.setenv(SALT_ENV, SALT)
    open_table, read_back = engine
    uri = str(tmp_path / "people")
    sink = ColumnRulesSink(MergeSink(open_table(uri), ("id",)), ColumnRules(spark, _pipeline(COLUMNS), "people"))
    batches = [
        [(UPSERT, _person(1, "DE", "ann"), None), (UPSERT, _person(2, "DE", "bo"), None),
         (UPSERT, _person(3, "FR", "cy"), None), (UPSERT, {**_person(4, "DE", "di"), "name": None}, None)],
        # 1 leaves the filter (deleted), 3 enters it, 2 is deleted, 4 keeps a column the source left unchanged
        [(UPSERT, _person(1, "FR", "ann"), None), (UPSERT, _person(3, "DE", "cy"), None),
         (DELETE, {"id": 2}, None), (UPSERT, {**_person(4, "DE", "di"), "secret": None}, ["secret"])],
    ]
    offset = 0
    for batch_id, batch in enumerate(batches):
        sink.apply_typed(_typed(batch, offset), APP, batch_id)
        offset += len(batch)
    assert sink.apply_typed(_typed(batches[1], 4), APP, 1).skipped_replay
    expected = [
        {"id": 3, "email": _hashed("cy.3@example.org"), "country": "DE", "name": "cy",
         "domain": "example.org", "tag": "CY"},
        {"id": 4, "email": _hashed("di.4@example.org"), "country": "DE", "name": "di",
         "domain": "example.org", "tag": "DI"},
    ]
    for table in (DeltaTable(uri).to_pyarrow_table(), read_back(uri), spark.read.format("delta").load(uri).toArrow()):
        assert table.column_names == ["id", "email", "country", "name", "domain", "tag"]
        assert sorted(table.to_pylist(), key=lambda r: r["id"]) == expected
    stored = _files_bytes(uri)
    assert b"cy.3@example.org" not in stored and b"ann.1@example.org" not in stored
    assert b"s3cret" not in stored
    assert _hashed("cy.3@example.org").encode() in stored  # the scan sees values the files do hold


def test_an_expression_that_does_not_compile_or_resolve_names_the_pipeline_and_column(spark, monkeypatch):
    with pytest.raises(ConfigError, match=r"pipeline people .*columns: domain: .*does not compile"):
        ColumnRules(spark, _pipeline({"computed": {"domain": "split(email, '@'"}}), "people")
    with pytest.raises(ConfigError, match=r"pipeline people .*columns: filter: .*does not compile"):
        ColumnRules(spark, _pipeline({"filter": "country = = 'DE'"}), "people")
    with pytest.raises(ConfigError, match=r"pipeline people .*CDC_TEST_COLUMNS_SALT.*salt_env"):
        monkeypatch.delenv(SALT_ENV, raising=False)
        ColumnRules(spark, _pipeline(COLUMNS), "people")
    rules = ColumnRules(spark, _pipeline({"filter": "region = 'EU'"}), "people")
    with pytest.raises(ConfigError, match=r"pipeline people .*columns: filter: .*region.*people"):
        rules.apply(_typed([(UPSERT, _person(1, "DE", "ann"), None)], 0), "/tables/people")


def _envelope(op: str, row: dict) -> bytes:
    return json.dumps({"before": row if op == "d" else None, "after": None if op == "d" else row, "op": op}).encode()


def _produce(bootstrap: str, topic: str, changes: list[tuple[str, dict]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for op, row in changes:
        producer.produce(topic, key=json.dumps({"id": row["id"]}).encode(), value=_envelope(op, row), partition=0)
    assert producer.flush(30) == 0


def test_a_pipeline_through_kafka_writes_only_the_filtered_computed_masked_columns(
        spark, kafka_bootstrap, unique, workdir, monkeypatch, caplog):
    monkeypatch.setenv(SALT_ENV, SALT)
    caplog.set_level(logging.INFO)  # the service logs at INFO; py4j at DEBUG echoes every JVM call
    topic = f"columns-{unique}"
    create_topics(kafka_bootstrap, [topic], 1)
    settings = settings_from_mapping({
        "kafka": {"bootstrap_servers": kafka_bootstrap}, "lakehouse": {"root": str(workdir / "tables")},
        "checkpoint_root": str(workdir / "checkpoints"),
        "pipelines": [{"name": "people", "topics": [topic], "table": "people", "primary_key": ["id"],
                       "columns": COLUMNS}],
    })
    uri = str(workdir / "tables" / "people")
    for changes in ([("c", _person(1, "DE", "ann")), ("c", _person(2, "FR", "bo"))],
                    [("u", _person(1, "FR", "ann")), ("u", _person(2, "DE", "bo"))]):
        _produce(kafka_bootstrap, topic, changes)
        runner = Runner(settings)
        runner.start(until_idle=True)
        runner.wait()
    expected = [{"id": 2, "email": _hashed("bo.2@example.org"), "country": "DE", "name": "bo",
                 "domain": "example.org", "tag": "BO"}]
    for table in (DeltaTable(uri).to_pyarrow_table(), spark.read.format("delta").load(uri).toArrow()):
        assert table.to_pylist() == expected
    stored = _files_bytes(uri)
    assert b"@example.org" not in stored and b"s3cret" not in stored
    assert "pipeline people: batch" in caplog.text  # the service's own log lines were captured
    assert "@example.org" not in caplog.text and "s3cret" not in caplog.text and SALT not in caplog.text


def test_the_projection_is_read_back_without_a_spark_job_and_equals_toarrow(spark, monkeypatch):
    """`collected` (the planned local scan, in the driver's JVM) against `collected_by_job` (`toArrow`) on
    the types a table holds, nulls included, in more than one Arrow batch; only the reference runs a Spark job."""
    monkeypatch.setenv(SALT_ENV, SALT)
    monkeypatch.setattr(column_rules, "_MAX_BATCH_ROWS", 2)
    rules = ColumnRules(spark, _pipeline({**COLUMNS, "computed": {"at": "CAST(seen AS DATE)", "twice": "price * 2"}}),
                        "people")
    extra = pa.table({"seen": pa.array([1_700_000_000_000_000, None, 0], pa.timestamp("us", tz="UTC")),
                      "price": pa.array([Decimal("1.25"), None, Decimal("-3.50")], pa.decimal128(10, 2)),
                      "tags": pa.array([["a", "b"], None, []], pa.list_(pa.string())),
                      "blob": pa.array([b"\x00\x01", None, b""], pa.binary())})
    changes = _typed([(UPSERT, _person(1, "DE", "ann"), None), (UPSERT, _person(2, "DE", "bo"), ["name"]),
                      (DELETE, {"id": 3}, None)], 0)
    for index, name in enumerate(extra.column_names):
        changes = changes.add_column(index + len(SCHEMA), extra.schema.field(name), extra.column(name))
    frame = spark.createDataFrame(changes).select(*rules.projection(changes.column_names))

    jobs_before = len(spark.sparkContext.statusTracker().getJobIdsForGroup())
    fast = collected(frame)
    jobs_fast = len(spark.sparkContext.statusTracker().getJobIdsForGroup())
    reference = collected_by_job(frame)
    jobs_reference = len(spark.sparkContext.statusTracker().getJobIdsForGroup())

    assert fast.schema == reference.schema and fast.to_pylist() == reference.to_pylist()
    assert fast.column("at").to_pylist() == [date(2023, 11, 14), None, None]
    assert jobs_fast == jobs_before and jobs_reference > jobs_fast


def test_a_history_part_keeps_its_change_columns_and_loses_the_excluded_and_raw_masked_values(spark, monkeypatch):
    """`apply_to_history`: the history's row changes (before images included) pass through include / exclude
    and mask as the table's net changes do; the change's kind, position and sequence value stay as they were."""
    monkeypatch.setenv(SALT_ENV, SALT)
    rows = _typed([(UPSERT, _person(1, "DE", "ann"), None), (ChangeKind.UPDATE_BEFORE, _person(1, "DE", "ann"), None),
                   (UPSERT, {**_person(1, "FR", "ann"), "email": None}, ["email"]), (DELETE, {"id": 2}, None)], 0)
    rows = rows.drop_columns([Meta.TIMESTAMP]).append_column(HISTORY_SEQUENCE, pa.array([10, 11, 11, 12], pa.int64()))
    rules = ColumnRules(spark, _pipeline({"exclude": ["secret"], "mask": {"email": "sha256"}, "salt_env": SALT_ENV}),
                        "people_history")
    part = rules.apply_to_history(rows, "/tables/people_history")
    assert part.column_names == ["id", "email", "country", "name", *HISTORY_META]
    assert part.select(list(HISTORY_META)).to_pylist() == rows.select(list(HISTORY_META)).to_pylist()
    assert part.column("email").to_pylist() == [_hashed("ann.1@example.org"), _hashed("ann.1@example.org"), None, None]
    assert part.column("country").to_pylist() == ["DE", "DE", "FR", None]
