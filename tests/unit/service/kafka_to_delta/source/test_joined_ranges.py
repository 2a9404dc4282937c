"""A database source task decodes a table's small ranges (its topic's partitions) as one chunk: the
batch's changes equal those of the ranges decoded one by one, each change keeps its partition and
offset, and anything the Arrow decode leaves to the record-by-record way sends the table back to
the ranges one by one, whose errors name the record's exact partition and offset."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest

from connectors.kafka.range_reader import SOURCE_SCHEMA, ValueChunk, joined_chunk
from connectors.kafka.source import KafkaRange
from service.config.databases import DatabaseSettings
from service.kafka_to_delta.rows.names import Meta
from service.kafka_to_delta.source.batch_changes import batch_changes
from service.kafka_to_delta.source.database_ranges import TableReducers, pack
from tests.support.run_seed import run_seed

TOPIC = "db.public.orders"
TABLE = "public_orders"
SEEDS = [0, 1, 2, run_seed(1 << 30)]


def _database() -> DatabaseSettings:
    return DatabaseSettings(name="db", topic_pattern=r"db\.(?P<schema>[^.]+)\.(?P<table>[^.]+)",
                            table_name="{schema}_{table}")


def _envelope(op: str, before: dict | None, after: dict | None, tick: int) -> bytes:
    return json.dumps({"before": before, "after": after, "op": op,
                       "source": {"schema": "public", "table": "orders", "lsn": tick}, "ts_ms": tick}).encode()


def _chunks(seed: int, partitions: int = 2, changes: int = 120) -> list[tuple[KafkaRange, list[ValueChunk]]]:
    """Debezium JSON changes of one table over `partitions` partitions (a key in one partition, as
    Debezium keys them, except a few keys written to every partition), with deletes and tombstones."""
    rng = random.Random(seed)
    live: dict[int, dict] = {}
    chunks = [ValueChunk(TOPIC, p) for p in range(partitions)]
    starts = [rng.randrange(0, 50) for _ in range(partitions)]
    for tick in range(changes):
        key = rng.randrange(30)
        partition = key % partitions if key >= 3 else rng.randrange(partitions)
        before = live.get(key)
        if before is None:
            op, after = "c", {"id": key, "name": f"n{tick}", "amount": rng.random() * 100}
        elif rng.random() < 0.15:
            op, after = "d", None
        else:
            op, after = "u", {**before, "name": f"n{tick}", "amount": rng.random() * 100}
        records = [_envelope(op, before, after, tick)] + ([None] if after is None else [])
        for value in records:
            chunk = chunks[partition]
            chunk.values.append(value)
            chunk.offsets.append(starts[partition] + len(chunk.offsets))
            chunk.timestamps.append(1_700_000_000_000 + tick)
            if chunk.first_key is None:
                chunk.first_key = json.dumps({"id": key}).encode()
        if after is None:
            live.pop(key, None)
        else:
            live[key] = after
    return [(KafkaRange(TOPIC, c.partition, starts[c.partition], starts[c.partition] + len(c.offsets)), [c])
            for c in chunks if c.offsets]


def _records(chunks: list[ValueChunk]) -> list[pa.RecordBatch]:
    """The chunks' records as the Kafka source reads them (`SOURCE_SCHEMA`), for the record-by-record way."""
    return [pa.RecordBatch.from_pydict({
        "key": [c.first_key] * len(c.offsets), "value": c.values, "topic": [c.topic] * len(c.offsets),
        "partition": [c.partition] * len(c.offsets), "offset": c.offsets,
        "timestamp": [None if t is None else t * 1000 for t in c.timestamps], "headers": [None] * len(c.offsets),
        "watermark_floor": [None] * len(c.offsets)}, schema=SOURCE_SCHEMA) for c in chunks]


def _one_by_one(reducers: TableReducers, ranges: list[tuple[KafkaRange, list[ValueChunk]]]) -> list[pa.RecordBatch]:
    return [batch for kafka_range, chunks in ranges
            for batch in reducers(kafka_range, TABLE, lambda c=chunks: iter(_records(c)), lambda c=chunks: iter(c))]


def _changes(batches: list[pa.RecordBatch]) -> pa.Table:
    changes = batch_changes(pa.Table.from_batches(batches).select(["part", "payload"])).changes
    return changes.sort_by([(name, "ascending") for name in Meta.ORDER])


@pytest.mark.parametrize("seed", SEEDS)
def test_a_tables_ranges_decoded_as_one_equal_the_ranges_one_by_one(seed):
    ranges = _chunks(seed)
    reducers = TableReducers(_database())
    joined = reducers.joined(TABLE, ranges)
    assert joined is not None, f"seed {seed}"
    batches = list(joined)
    assert len(batches) == 1 and batches[0].num_rows == 1, f"seed {seed}: one payload for the table"
    expected = _changes(_one_by_one(reducers, ranges))
    got = _changes(batches)
    assert got.num_rows > 0 and got.equals(expected), f"seed {seed}"
    assert set(got.column(Meta.PARTITION).to_pylist()) == {0, 1}, f"seed {seed}"
    assert batches[0].column("table").to_pylist() == [TABLE] and batches[0].column("primary_key").to_pylist() == ["id"]


def test_a_record_left_to_the_record_by_record_way_sends_the_table_back_to_its_ranges():
    ranges = _chunks(7)
    bad_range, bad_chunks = ranges[1]
    bad_chunks[0].values[3] = b'{"before": null, "after": {"id": 5, "name": "x"'  # cut short
    reducers = TableReducers(_database())
    assert reducers.joined(TABLE, ranges) is None
    result = batch_changes(pa.Table.from_batches(_one_by_one(reducers, ranges)).select(["part", "payload"]))
    failed = result.failed.to_pylist()
    assert [(row["topic"], row["partition"], row["offset"]) for row in failed] == [
        (TOPIC, 1, bad_chunks[0].offsets[3])]


def test_ranges_whose_first_keys_name_different_fields_are_not_joined():
    ranges = _chunks(3)
    ranges[1][1][0].first_key = b'{"order_id": 1}'
    assert TableReducers(_database()).joined(TABLE, ranges) is None


def test_joined_chunk_keeps_each_records_partition_and_refuses_two_topics():
    a = ValueChunk(TOPIC, 0, [b"a", None], [4, 5], [1, 2], None)
    b = ValueChunk(TOPIC, 1, [b"b"], [9], [None], b"k")
    joined = joined_chunk([a, b])
    assert (joined.values, joined.offsets, joined.timestamps, joined.partitions, joined.first_key) == (
        [b"a", None, b"b"], [4, 5, 9], [1, 2, None], [0, 0, 1], b"k")
    with pytest.raises(ValueError, match="several topics"):
        joined_chunk([a, ValueChunk("other", 0, [b"c"], [1], [None])])


def test_packing_keeps_a_topics_small_ranges_in_one_task():
    ranges = [KafkaRange(f"t{t:02d}", p, 0, 5 + t) for t in range(20) for p in range(2)]
    tasks = pack(ranges, min_tasks=2)
    assert len(tasks) == 2
    for task in tasks:
        topics = {r.topic for r in task.ranges}
        assert all(sum(r.topic == topic for r in task.ranges) == 2 for topic in topics)
    # fewer topics than tasks wanted: each range alone, so that every core reads
    assert [len(task.ranges) for task in pack([KafkaRange("t", p, 0, 10) for p in range(2)], min_tasks=2)] == [1, 1]
