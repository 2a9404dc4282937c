"""A database source task decodes the tables that decode alike in one call keyed by table
(`joint_tables`): every table's changes and failed records equal those of the table decoded on its
own (its ranges as one, or range by range), with odd records, errors at their exact topic,
partition and offset, placeholders, kind clashes between tables, tombstones and other keys among
the tables; tables that cannot be sure of that go alone."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest

from connectors.kafka.range_reader import ValueChunk
from connectors.kafka.source import KafkaRange
from service.config.databases import DatabaseSettings
from service.kafka_to_delta.rows.names import Meta
from service.kafka_to_delta.source.batch_changes import batch_changes
from service.kafka_to_delta.source.database_ranges import TableReducers, task_payloads
from service.kafka_to_delta.source.joint_tables import TABLE_ROWS
from tests.support.run_seed import run_seed
from tests.unit.service.kafka_to_delta.source.test_joined_ranges import _records

SEEDS = [0, 1, 2, 3, 4, run_seed(1 << 30)]
PLACEHOLDER = "__debezium_unavailable_value"
KINDS = ["plain", "plain", "plain", "plain", "ints", "null_note", "other_order", "odd", "placeholder",
         "other_key", "tombstones", "nested", "one_partition", "bool_name"]


def _database() -> DatabaseSettings:
    return DatabaseSettings(name="db", topic_pattern=r"db\.(?P<schema>[^.]+)\.(?P<table>[^.]+)",
                            table_name="{schema}_{table}")


def _row(kind: str, key: int, tick: int, rng: random.Random) -> dict:
    amount = rng.randrange(1000) if kind == "ints" else round(rng.random() * 100, 2) + 0.005
    row = {"id": key, "name": f"n{tick}", "amount": amount}
    if kind == "other_order":
        row = {"name": row["name"], "id": key, "amount": amount}
    elif kind == "null_note":
        row["note"] = None
    elif kind == "other_key":
        row = {"code": key, "name": row["name"], "amount": amount}
    elif kind == "nested":
        row["tags"] = {"a": tick}
    elif kind == "bool_name":
        row["name"] = tick % 2 == 0
    return row


def _table(kind: str, index: int, rng: random.Random) -> tuple[str, list[tuple[KafkaRange, list[ValueChunk]]]]:
    """One table's small ranges: Debezium JSON changes of `kind` (its odd records, placeholders,
    tombstones, key...) over one or two partitions, each range at its own start offset."""
    topic = f"db.public.t{index:02d}"
    partitions = 1 if kind == "one_partition" else 2
    key_name = "code" if kind == "other_key" else "id"
    chunks = [ValueChunk(topic, p) for p in range(partitions)]
    starts = [rng.randrange(0, 50) for _ in range(partitions)]
    live: dict[int, dict] = {}
    for tick in range(rng.randrange(1, 40)):
        key = rng.randrange(12)
        before = live.get(key)
        if kind == "tombstones":
            records: list[bytes | None] = [None]
        else:
            if before is None:
                op, after = "c", _row(kind, key, tick, rng)
            elif rng.random() < 0.15:
                op, after = "d", None
            else:
                op, after = "u", _row(kind, key, tick, rng)
                if kind == "placeholder" and rng.random() < 0.5:
                    after["name"] = PLACEHOLDER
            envelope = {"before": before, "after": after, "op": op, "source": {"table": f"t{index:02d}", "lsn": tick},
                        "ts_ms": tick}
            records = [json.dumps(envelope).encode()] + ([None] if after is None else [])
            if after is None:
                live.pop(key, None)
            else:
                live[key] = after
        for value in records:
            chunk = chunks[key % partitions]
            chunk.values.append(value)
            chunk.offsets.append(starts[chunk.partition] + len(chunk.offsets))
            chunk.timestamps.append(1_700_000_000_000 + tick)
            if chunk.first_key is None:
                chunk.first_key = json.dumps({key_name: key}).encode()
    if kind == "odd":
        chunk = max(chunks, key=lambda c: len(c.values))
        bad = [b'{"before": null, "after": {"id": 5, "name": "x"', b'{"before": null, "after": {"id": 6}, "op": "x"}',
               b'{"before": null, "after": {"id": null, "name": "y", "amount": 1.5}, "op": "c"}']
        for value in bad:
            chunk.values.append(value)
            chunk.offsets.append(starts[chunk.partition] + len(chunk.offsets))
            chunk.timestamps.append(None)
    return topic, [(KafkaRange(topic, c.partition, starts[c.partition], starts[c.partition] + len(c.offsets)), [c])
                   for c in chunks if c.offsets]


def _task(reducers: TableReducers, tables: list[tuple[str, list[tuple[KafkaRange, list[ValueChunk]]]]]
          ) -> list[pa.RecordBatch]:
    """What a task holding these tables' small ranges yields."""
    small = {(r.topic, r.partition, r.start, r.end): chunks for _, ranges in tables for r, chunks in ranges}
    ranges = [(r, topic.replace("db.public.", "public_")) for topic, table_ranges in tables for r, _ in table_ranges]

    def read(kafka_range: KafkaRange):
        return iter(_records(small[(kafka_range.topic, kafka_range.partition, kafka_range.start, kafka_range.end)]))

    return list(task_payloads(reducers, ranges, small, read, lambda r: pytest.fail("no large range here")))


def _by_table(batches: list[pa.RecordBatch]) -> dict[str, tuple[pa.Table, pa.Table]]:
    """Per table: its merged changes (sorted) and failed records, as the driver sees them."""
    rows = pa.Table.from_batches(batches)
    result = {}
    for table in set(rows.column("table").to_pylist()):
        mine = rows.filter(pa.compute.equal(rows.column("table"), table))
        merged = batch_changes(mine.select(["part", "payload"]))
        changes = merged.changes
        if changes.num_rows:
            changes = changes.sort_by([(name, "ascending") for name in Meta.ORDER])
        result[table] = (changes, merged.failed)
    return result


@pytest.mark.parametrize("seed", SEEDS)
def test_tables_decoded_together_equal_each_table_decoded_alone(seed):
    rng = random.Random(seed)
    kinds = rng.sample(KINDS, len(KINDS))
    tables = [_table(kind, index, rng) for index, kind in enumerate(kinds)]
    reducers = TableReducers(_database())
    together = _task(reducers, tables)
    alone = [batch for table in tables for batch in _task(reducers, [table])]
    got, expected = _by_table(together), _by_table(alone)
    assert got.keys() == expected.keys(), f"seed {seed}"
    for table, (changes, failed) in expected.items():
        assert got[table][0].equals(changes), f"seed {seed}, table {table}"
        assert got[table][1].equals(failed), f"seed {seed}, table {table}"
    # the tables that decode alike went together, one payload row each
    _, done = reducers.together([(topic.replace("db.public.", "public_"), ranges) for topic, ranges in tables])
    placeholders = {topic for topic, ranges in tables
                    if any(v is not None and PLACEHOLDER.encode() in v for _, [c] in ranges for v in c.values)}
    assert done == {topic for (topic, _), kind in zip(tables, kinds)
                    if kind in ("plain", "one_partition") or (kind == "placeholder" and topic not in placeholders)}, seed
    # the odd table's errors at their exact coordinates
    topic, ranges = tables[kinds.index("odd")]
    bad = [(topic, r.partition, offset) for r, chunks in ranges for c in chunks
           for offset in c.offsets[-3:] if len(c.offsets) == max(len(x.offsets) for _, [x] in ranges)]
    failed = got[topic.replace("db.public.", "public_")][1].to_pylist()
    assert [(row["topic"], row["partition"], row["offset"]) for row in failed] == bad[:len(failed)], seed
    assert failed, f"seed {seed}"


def test_a_table_of_many_records_goes_alone():
    rng = random.Random(5)
    tables = [_table("plain", index, rng) for index in range(3)]
    topic, ranges = tables[0]
    chunk = ranges[0][1][0]
    while sum(len(c.offsets) for _, [c] in ranges) <= TABLE_ROWS:
        chunk.values.append(chunk.values[0])
        chunk.offsets.append(chunk.offsets[-1] + 1)
        chunk.timestamps.append(None)
    ranges[0] = (KafkaRange(topic, chunk.partition, chunk.offsets[0], chunk.offsets[-1] + 1), [chunk])
    _, done = TableReducers(_database()).together([(t.replace("db.public.", "public_"), r) for t, r in tables])
    assert done == {tables[1][0], tables[2][0]}
