"""A real change capture end to end: PostgreSQL -> the Debezium engine -> Kafka -> `cdc-lakehouse run
--until-idle` -> Delta; every Delta table equals `SELECT *` of its source table, column for column.

The capture runs once per module (fixture `captured`): tables and snapshot rows, the engine
started and streaming, the mixed workload (tests/support/capture/workload.py), a marker row last, the
engine stopped once it captured the marker, then one pipeline per table and one `--until-idle`
run. The checks, the pipelines and the comparison with `SELECT *` are tests/support/capture/checks.py's
(shared with the Kafka Connect capture, test_connect_capture.py).

The same run also materializes `documents` (`upsert_materialize: force`) twice, in one micro-batch and
in batches of 25 records: a TOASTed `body` left unchanged by an update takes the value the key's earlier
change gave it, from the same micro-batch or from the table, as on the plain path.

The same run also writes an SCD type 2 history (`history:`) of `customers` from a scrambled copy of its
topic: two partitions, the first half of the records in partition 1 and the rest in partition 0, read in
small batches, so that a key's later changes are applied before its earlier ones (cross-partition
disorder). The history (delta-rs, then delta-spark in a second run that also replays the first run's last
batch) must equal the history walked from the original topic in the source's commit order.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from deltalake import DeltaTable

from service.config.history import DELETED, END_AT, START_AT, UPDATED_AT
from service.operations.workload import create_topics
from tests.support.capture.checks import (  # noqa: F401 - the shared checks, collected here
    Capture,
    compare,
    ingest,
    phase,
    records,
    run_sql,
    test_capture_holds_every_case_of_the_workload,
    test_delta_column_types_follow_postgres,
    test_delta_table_equals_select_star,
    test_the_truncate_deletes_rows_stored_by_earlier_batches,
)
from tests.support.capture.debezium_engine import EngineProcess, debezium_properties
from tests.support.capture.postgres import (  # noqa: F401 - the session fixture
    PostgresCluster,
    postgres,
)
from tests.support.capture.workload import MARKER_RECORDS, MARKER_TABLE, SCHEMA, TABLES, Workload
from tests.support.history_reference import reference_rows
from tests.support.pipeline_harness import run_cli, write_config

pytestmark = pytest.mark.slow
HISTORY_TABLE = "customers"
TRACKED = ("name", "visits")
HISTORY_COLUMNS = ("id", *TRACKED, START_AT, END_AT, UPDATED_AT, DELETED)


def _history_pipeline(name: str, topic: str, table: str, batch: int) -> dict:
    return {"name": name, "topics": [topic], "table": table, "primary_key": ["id"],
            "max_offsets_per_trigger": batch, "history": {"track_history_column_list": list(TRACKED)}}


def _materialized_pipeline(topic: str, table: str, batch: int | None) -> dict:
    return {"name": f"rc_{table}", "topics": [topic], "table": table, "primary_key": ["id"],
            "upsert_materialize": "force", **({"max_offsets_per_trigger": batch} if batch else {})}


MATERIALIZED = {"documents_materialized": None, "documents_materialized_small": 25}
"""Materialized copies of `documents`: the table and its micro-batch size (None: one batch)."""


def _scrambled_copy(bootstrap: str, topic: str) -> str:
    """A two-partition copy of one-partition `topic`: its first half in partition 1, the rest in partition 0."""
    copy = f"{topic}.scrambled"
    create_topics(bootstrap, [copy], 2)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"rc-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    producer = Producer({"bootstrap.servers": bootstrap})
    try:
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, 0)])
        for offset in range(end):
            message = consumer.poll(10)
            assert message is not None and message.error() is None, f"{topic}: copy stopped at {offset}"
            producer.produce(copy, key=message.key(), value=message.value(), partition=1 if offset < end // 2 else 0)
        assert producer.flush(30) == 0
    finally:
        consumer.close()
    return copy


def _capture(cluster: PostgresCluster, bootstrap: str, workdir: Path, timings: dict) -> Capture:
    unique = uuid.uuid4().hex[:8]
    dbname, prefix = f"rc_{unique}", f"rc{unique}"
    topics = {t.name: f"{prefix}.{SCHEMA}.{t.name}" for t in TABLES}
    workload, started = Workload(seed=11), time.monotonic()
    cluster.execute(f"CREATE DATABASE {dbname}", dbname="postgres")
    run_sql(cluster, workdir, "snapshot", workload.schema_sql() + "\n" + workload.snapshot_sql(), dbname)
    create_topics(bootstrap, topics.values(), 1)  # one partition: keyless rows have no key to route by
    started = phase(timings, "tables and snapshot rows", started)
    properties = debezium_properties(name=f"rc_{unique}", port=cluster.port, dbname=dbname, prefix=prefix,
                                     tables=[f"{SCHEMA}.{t.name}" for t in TABLES], workdir=workdir)
    engine = EngineProcess(properties, bootstrap, workdir, topics[MARKER_TABLE], MARKER_RECORDS).start()
    try:
        engine.wait_streaming()
        started = phase(timings, "engine start to streaming", started)
        run_sql(cluster, workdir, "streaming", workload.streaming_sql(), dbname)
        run_sql(cluster, workdir, "marker", workload.marker_sql(), dbname)
        started = phase(timings, "streaming workload (SQL)", started)
        produced = engine.wait_captured()
        phase(timings, "capture drained, engine stopped", started)
    finally:
        engine.stop()
        cluster.drop_replication_slot(properties["slot.name"])
    return Capture(dbname, topics, produced, workdir / "tables", timings)


@pytest.fixture(scope="module")
def captured(postgres: PostgresCluster, kafka_bootstrap: str, tmp_path_factory) -> Capture:  # noqa: F811
    """The whole capture and one `--until-idle` ingest of it."""
    workdir = tmp_path_factory.mktemp("real_capture")
    capture = _capture(postgres, kafka_bootstrap, workdir, {})
    scrambled = _scrambled_copy(kafka_bootstrap, capture.topics[HISTORY_TABLE])
    materialized = [_materialized_pipeline(capture.topics["documents"], table, batch)
                    for table, batch in MATERIALIZED.items()]
    ingest(capture, kafka_bootstrap, workdir,
           [_history_pipeline("rc_history", scrambled, "scrambled", 700), *materialized])
    return capture


def _walked_history(bootstrap: str, topic: str) -> list[dict]:
    """The history walked from the captured changes in the source's commit order (the one-partition topic's)."""
    changes, last_lsn = [], {}
    for _, payload, _ in records(bootstrap, topic):
        if payload is None:  # a delete's tombstone
            continue
        deleted = payload["op"] == "d"
        row = payload["before"] if deleted else payload["after"]
        lsn = payload["source"]["lsn"]
        assert lsn >= last_lsn.get(row["id"], lsn), f"key {row['id']}: the topic is not in commit order"
        last_lsn[row["id"]] = lsn
        changes.append((row["id"], lsn, deleted, row))
    assert {change[3].get("id") is not None for change in changes} == {True}
    rekeyed = [h for _, p, h in records(bootstrap, topic) if p and p["op"] == "d" and "__debezium.newkey" in h]
    assert rekeyed, "no primary-key change"
    return reference_rows(changes, TRACKED, TRACKED, markers=False)


def _history(root: Path, table: str) -> list[dict]:
    rows = DeltaTable(str(root / f"{table}_history")).to_pyarrow_table().select(list(HISTORY_COLUMNS)).to_pylist()
    return sorted(rows, key=lambda r: (r["id"], r[START_AT]))


def test_history_under_cross_partition_disorder_equals_the_commit_order_walk_on_both_engines(
        captured: Capture, kafka_bootstrap: str):
    walked = _walked_history(kafka_bootstrap, captured.topics[HISTORY_TABLE])
    after_delete = [a for a, b in zip(walked, walked[1:]) if a["id"] == b["id"] and a[END_AT] != b[START_AT]]
    assert after_delete, "no key was inserted again after its delete"
    root = captured.tables_root
    assert _history(root, "scrambled") == walked
    history = DeltaTable(str(root / "scrambled_history"))
    assert sum(c["operation"] == "MERGE" for c in history.history()) > 1  # the disorder spans batches
    version = history.version()

    workdir = root.parent  # delta-spark: the history written anew, and the first run's last batch replayed
    commits = workdir / "checkpoints" / "rc_history" / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    for name in (str(last), f".{last}.crc"):
        (commits / name).unlink(missing_ok=True)
    scrambled = f"{captured.topics[HISTORY_TABLE]}.scrambled"
    pipelines = [_history_pipeline("rc_history", scrambled, "scrambled", 700),
                 _history_pipeline("rc_history_spark", scrambled, "scrambled_spark", 1000)]
    config = write_config(workdir / "config_spark.yaml", kafka_bootstrap, workdir, pipelines, engine="delta-spark")
    result = run_cli(config, "--until-idle")
    assert result.returncode == 0, result.stderr[-3000:]
    assert DeltaTable(str(root / "scrambled_history")).version() == version  # the replay added no version
    assert _history(root, "scrambled") == walked
    assert _history(root, "scrambled_spark") == walked


@pytest.mark.parametrize("table", sorted(MATERIALIZED))
def test_the_materializer_fills_toasted_values_as_the_plain_path_does(
        captured: Capture, postgres: PostgresCluster, table: str):  # noqa: F811
    compare(captured, postgres, "documents", None, delta_table=table)
