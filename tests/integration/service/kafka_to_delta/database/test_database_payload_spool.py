"""A database source's payloads handed to the driver in files on a local master (`rows.payload_spool`), as the
plain path's are: real Apache Kafka, Spark's streaming query and Python workers, the tables read back with
delta-rs."""

from __future__ import annotations

import json

from confluent_kafka import Producer
from deltalake import DeltaTable

from service.config.settings import settings_from_mapping
from service.operations.workload import create_topics
from service.supervisor.runner import Runner
from tests.support.spool_watch import SpoolWatch


def test_a_databases_payloads_come_in_one_spools_files_uncompressed_and_gone_after_each_batch(
        spark, kafka_bootstrap, unique, workdir, monkeypatch):
    topics = {table: f"dbspool-{unique}.{table}" for table in ("customers", "orders")}
    create_topics(kafka_bootstrap, list(topics.values()), 2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    expected: dict[str, dict[int, str]] = {table: {} for table in topics}
    for table, topic in topics.items():
        changes = [("c", {"id": i, "name": f"{table}-{i}"}) for i in range(30)]
        changes += [("u", {"id": i, "name": f"{table}-{i}-again"}) for i in range(3, 30, 7)]
        for op, row in changes:
            expected[table][row["id"]] = row["name"]
            producer.produce(topic, key=json.dumps({"id": row["id"]}).encode(), partition=row["id"] % 2,
                             value=json.dumps({"before": None, "after": row, "op": op}).encode())
    assert producer.flush(30) == 0
    watch = SpoolWatch(monkeypatch)
    settings = settings_from_mapping({
        "kafka": {"bootstrap_servers": kafka_bootstrap},
        "lakehouse": {"root": str(workdir / "tables")},
        "checkpoint_root": str(workdir / "checkpoints"),
        "databases": [{"name": "spooled", "max_offsets_per_trigger": 20,
                       "topic_pattern": rf"dbspool-{unique}\.(?P<table>[^.]+)",
                       "tables": {table: {"primary_key": ["id"]} for table in topics}}],
    })
    runner = Runner(settings)
    runner.start(until_idle=True)
    runner.wait()
    watch.check(batch_files=2 * 2 * 2)  # one batch's: two tables, two ranges each, two parts
    for table in topics:
        rows = DeltaTable(str(workdir / "tables" / table)).to_pyarrow_table().to_pylist()
        assert {r["id"]: r["name"] for r in rows} == expected[table]
