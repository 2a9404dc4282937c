"""The plain path's payloads handed to the driver in files on a local master (`rows.payload_spool`): real
Apache Kafka, Spark's streaming query and Python workers, the delta-rs table read back."""

from __future__ import annotations

import json
import os

import pyarrow as pa
from confluent_kafka import Producer

from service.config.settings import settings_from_mapping
from service.kafka_to_delta.rows.ipc import ipc_bytes
from service.kafka_to_delta.rows.payload_spool import MARK
from service.kafka_to_delta.source import batch_changes
from service.operations.workload import create_topics
from service.supervisor.runner import Runner
from tests.support.pipeline_harness import table_rows


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
    handed: list[str] = []
    left_behind: list[list[str]] = []
    uncompressed: list[bool] = []
    real = batch_changes.resolved

    def observed(payload: bytes) -> bytes:  # what the driver is given, and the spool it came from
        if payload.startswith(MARK):
            handed.append(payload[len(MARK):].decode())
            left_behind.append(os.listdir(os.path.dirname(handed[-1])))
        data = real(payload)
        uncompressed.append(data == ipc_bytes(pa.ipc.open_stream(data).read_all(), compressed=False))
        return data

    monkeypatch.setattr(batch_changes, "resolved", observed)
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
    assert handed, "no payload was handed over in a file"
    assert all(uncompressed), "a payload handed over in a file was compressed (it never crosses the JVM)"
    spool = os.path.dirname(handed[0])
    assert all(os.path.dirname(path) == spool for path in handed)
    assert all(not os.path.exists(path) for path in handed)  # each batch's files removed once read
    assert max(len(files) for files in left_behind) <= 2 * 2  # never more than one batch's (two ranges, two parts)
    assert not os.path.exists(spool)  # the query stopped: its spool is gone
    expected = {row["id"]: row["name"] for row in rows} | {3: "again"}
    assert {r["id"]: r["name"] for r in table_rows(workdir / "tables" / "t")} == expected
