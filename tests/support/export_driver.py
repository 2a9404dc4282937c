"""Export test helpers: a JSON encoder, reading a topic back, and a driver that runs one export
until idle in a process of its own (the SIGKILL end-to-end test starts and kills it).

usage: python -m tests.support.export_driver <settings.json>
with keys: name, table_uri, topic, bootstrap, checkpoint, positions_topic, max_versions_per_trigger.
Exit code 0 when everything available at start is exported.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition

from connectors.kafka.cluster import ClusterView
from connectors.kafka.transactional_producer import KafkaRecord

CHANGE_HEADER = "change"
_READ_TIMEOUT_S = 120


def json_records(feed: pa.Table) -> list[KafkaRecord]:
    """One JSON record per feed row (pre-images included), keyed by `id`, in the order given."""
    records = []
    for row in feed.to_pylist():
        value = {k: v for k, v in row.items() if not k.startswith("_")}
        value.update(change=row["_change_type"], version=row["_commit_version"])
        records.append((
            str(row["id"]).encode(), json.dumps(value, default=str).encode(),
            [(CHANGE_HEADER, row["_change_type"].encode())],
        ))
    return records


def consume(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[tuple]:
    """Every record of partition 0 of `topic` visible at `isolation`: (key, value, headers).

    Read to the log end, not to the last stable offset: Apache Kafka writes a transaction's
    markers after `commit_transaction` returned, so right after a commit the stable offset may
    still be below it. A read_committed position passes the log end once every transaction below
    it is decided.
    """
    end = ClusterView({"bootstrap.servers": bootstrap}).log_ends([(topic, 0)])[(topic, 0)]
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"check-{time.monotonic_ns()}", "isolation.level": isolation,
        "enable.auto.commit": False, "session.timeout.ms": 6000,
    })
    consumer.assign([TopicPartition(topic, 0, 0)])
    records, deadline = [], time.monotonic() + _READ_TIMEOUT_S
    try:
        while consumer.position([TopicPartition(topic, 0)])[0].offset < end:
            assert time.monotonic() < deadline, f"{topic} not read to its end ({end}) within {_READ_TIMEOUT_S}s"
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                records.append((message.key(), message.value(), message.headers()))
        return records
    finally:
        consumer.close()


def main(path: str) -> int:
    """Export until idle; returns the exit code."""
    from service.config.settings import SparkSettings
    from service.delta_to_kafka.pipeline import ExportPipeline
    from service.runtime.spark_session import build_spark

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout)
    config = json.loads(Path(path).read_text())
    spark = build_spark(SparkSettings(master="local[2]", shuffle_partitions=2))
    pipeline = ExportPipeline(
        spark, config["name"], config["table_uri"], config["topic"], {"bootstrap.servers": config["bootstrap"]},
        config["checkpoint"], json_records, positions_topic=config["positions_topic"],
        max_versions_per_trigger=config["max_versions_per_trigger"],
    )
    query = pipeline.start(until_idle=True)
    try:
        query.awaitTermination()
    finally:
        pipeline.close()
    print(f"export done: {pipeline.committed_batches} committed, {pipeline.skipped_batches} skipped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
