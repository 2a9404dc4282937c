"""The plain path's payloads handed to the driver in files on a local master (`rows.payload_spool`): real
Apache Kafka, Spark's streaming query and Python workers, the delta-rs table read back."""

from __future__ import annotations

import json

from confluent_kafka import Producer

from service.config.settings import settings_from_mapping
from service.operations.workload import create_topics
from service.supervisor.runner import Runner
from tests.support.pipeline_harness import table_rows
from tests.support.spool_watch import SpoolWatch


def test_a_local_masters_payloads_come_in_the_spools_files_which_are_gone_after_each_batch(
        spark, kafka_bootstrap, unique, workdir, monkeypatch):
    topic = f"spool-{unique}"
    create_topics(kafka_bootstrap, [topic], 2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    rows = [{"id": i, "name": f"n{i}"} for i in range(40)]
    for row in rows + [{"id": 3, "name": "again"}]:
        producer.produce(topic, key=json.dumps({"id": row["id"]}).encode(), partition=row["id"] % 2,
                         value=json.dumps({"before": None, "after": row, "op": "c"}).encode())
    assert producer.flush(30) == 0
    watch = SpoolWatch(monkeypatch)
    settings = settings_from_mapping({
        "kafka": {"bootstrap_servers": kafka_bootstrap},
        "lakehouse": {"root": str(workdir / "tables")},
        "checkpoint_root": str(workdir / "checkpoints"),
        "pipelines": [{"name": "spooled", "topics": [topic], "table": "t", "primary_key": ["id"],
                       "max_offsets_per_trigger": 20}],
    })
    runner = Runner(settings)
    runner.start(until_idle=True)
    runner.wait()
    watch.check(batch_files=2 * 2)  # one batch's: two ranges, two parts
    expected = {row["id"]: row["name"] for row in rows} | {3: "again"}
    assert {r["id"]: r["name"] for r in table_rows(workdir / "tables" / "t")} == expected
