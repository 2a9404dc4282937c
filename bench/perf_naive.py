"""A naive single-process ingest pipeline, the yardstick of the performance benchmark.

Consume the topic with confluent-kafka, keep the last change per key per window of records
(50,000 by default), then one delta-rs MERGE per window. It knows the workload's columns,
handles envelopes with and without the Connect schema block, and does nothing else: no
disorder handling, no exactly once, no checkpoint, no bad-record policy.
"""

from __future__ import annotations

import time
import uuid
from typing import Iterator

import orjson
import pyarrow as pa
from confluent_kafka import Consumer, Message, TopicPartition
from deltalake import DeltaTable, write_deltalake
from ingest_benchmark import MAX_RESPONSE_BYTES

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("email", pa.string()),
                    ("balance", pa.float64()), ("active", pa.bool_())])
DELETED = "_deleted"
_CONSUME_BATCH = 10_000
_STALL_S = 30.0


def messages_to_high_watermarks(bootstrap: str, topic: str, partitions: int) -> Iterator[Message]:
    """Every record of `topic`'s `partitions` from offset 0 to the high watermarks seen at the start,
    in consume order; stops the benchmark (naming the watermarks) when no record arrives for 30 s."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"naive-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.partition.eof": False,
                         "receive.message.max.bytes": MAX_RESPONSE_BYTES})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
        open_partitions = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        progressed = time.perf_counter()
        while open_partitions:
            messages = consumer.consume(_CONSUME_BATCH, timeout=1.0)
            if messages:
                progressed = time.perf_counter()
            elif time.perf_counter() - progressed > _STALL_S:
                raise SystemExit(f"FAILED: naive pipeline stalled before the high watermarks {ends}")
            for message in messages:
                if message.error():
                    raise SystemExit(f"FAILED: consumer error {message.error()}")
                yield message
                if message.offset() + 1 >= ends[message.partition()]:
                    open_partitions.discard(message.partition())
    finally:
        consumer.close()


def _source(last: dict[int, dict | None]) -> pa.Table:
    """The window's last change per key as an Arrow table with a `_deleted` flag."""
    columns = {name: [] for name in SCHEMA.names}
    deleted = []
    for key, row in last.items():
        deleted.append(row is None)
        row = row or {"id": key}
        for name, values in columns.items():
            values.append(row.get(name))
    return pa.table({**columns, DELETED: deleted}, schema=SCHEMA.append(pa.field(DELETED, pa.bool_())))


def _merge(table: DeltaTable, source: pa.Table) -> None:
    others = [name for name in SCHEMA.names if name != "id"]
    (table.merge(source, "t.id = s.id", source_alias="s", target_alias="t")
     .when_matched_delete(predicate=f"s.{DELETED}")
     .when_matched_update(updates={c: f"s.{c}" for c in others}, predicate=f"NOT s.{DELETED}")
     .when_not_matched_insert(updates={c: f"s.{c}" for c in SCHEMA.names}, predicate=f"NOT s.{DELETED}")
     .execute())


def _apply(last: dict[int, dict | None], value: bytes) -> None:
    """Keep one Debezium envelope (with or without the schema block) as its key's last change."""
    document = orjson.loads(value)
    payload = document["payload"] if "payload" in document else document
    if payload["op"] == "d":
        last[payload["before"]["id"]] = None
    else:
        after = payload["after"]
        last[after["id"]] = after


def run_naive(bootstrap: str, topic: str, partitions: int, uri: str, window: int = 50_000) -> dict[str, float]:
    """Ingest `topic` from offset 0 to its high watermarks into a new Delta table at `uri`.

    Returns {'records', 'seconds', 'merges'}; seconds from the consumer's creation to the last MERGE.
    """
    started = time.perf_counter()
    write_deltalake(uri, SCHEMA.empty_table())
    table = DeltaTable(uri)
    records = merges = pending_records = 0
    last: dict[int, dict | None] = {}
    for message in messages_to_high_watermarks(bootstrap, topic, partitions):
        records += 1
        pending_records += 1
        if message.value() is not None:  # a tombstone follows its delete: nothing to do
            _apply(last, message.value())
        if pending_records >= window:
            _merge(table, _source(last))
            merges, pending_records, last = merges + 1, 0, {}
    if last:
        _merge(table, _source(last))
        merges += 1
    return {"records": records, "seconds": time.perf_counter() - started, "merges": merges}
