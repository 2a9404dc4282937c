"""Changes packed per key bucket where they are decoded (`bucket_packing`): every change lands, once,
in the bucket Spark's hash gives its group key, with what the bucket stage reads of it, and each
packed row carries the largest watermark candidate of its changes."""

from __future__ import annotations

import json
import random

import pyarrow as pa

from service.config.settings import PipelineSettings
from service.kafka_to_delta.materialize.bulk import ERROR_PREFIX
from service.kafka_to_delta.rows.ipc import unpack_changes
from service.kafka_to_delta.rows.names import (
    BUCKET,
    EVENT_TIME,
    GROUP,
    PACKED_CHANGES,
    STAGE_FIELDS,
    WATERMARK_COLUMN,
    Column,
)
from service.kafka_to_delta.source.bucket_packing import (
    PackedBuckets,
    packed_buckets,
    spark_bucket,
)
from service.kafka_to_delta.source.decode_stage import DecodedRanges
from tests.unit.service.kafka_to_delta.source.test_decoded_ranges import _records

SEEDS = [1, 2, 3, 5, 8, 13]


def test_spark_bucket_matches_values_spark_computed():
    # `SELECT pmod(xxhash64(s), 16)` as Spark 4.2 printed it; tests/integration/service/kafka_to_delta/source/test_bucket_packing.py
    # compares many more against a live session.
    known = {"[1]": 10, '["perf",[3]]': 11, "": 4, "é": 4}
    assert {s: spark_bucket(s, 16) for s in known} == known
    assert spark_bucket(None, 16) == 42 % 16  # Spark hashes a null to the seed


def _changes(seed: int) -> pa.RecordBatch:
    """A decoded chunk: changelog rows of random keys (some failed), with watermark candidates."""
    rnd = random.Random(seed)
    n = rnd.randrange(1, 300)
    failed = [rnd.random() < 0.1 for _ in range(n)]
    times = [None if rnd.random() < 0.2 else rnd.randrange(10_000) for _ in range(n)]
    return pa.RecordBatch.from_pydict({
        Column.TOPIC: ["t"] * n, Column.PARTITION: pa.array([seed % 4] * n, pa.int32()),
        Column.OFFSET: list(range(n)), Column.CHANGE_INDEX: pa.array([0] * n, pa.int32()),
        Column.TIMESTAMP: [50_000 + i for i in range(n)], Column.KIND: ["+U"] * n,
        Column.KEY: [None if f else json.dumps([rnd.randrange(40)]) for f in failed],
        Column.UPSERT_KEY: [None] * n, Column.PARTITION_KEY: [None] * n,
        Column.ROW: [json.dumps({"v": i}) for i in range(n)], Column.TYPES: [None] * n, Column.UNCHANGED: [None] * n,
        Column.INTENT: [None] * n, Column.SNAPSHOT: [None] * n, Column.SEQUENCE: [None] * n,
        Column.EVENT_TIME: pa.array(times, pa.int64()), Column.ERROR: ["bad" if f else None for f in failed],
        Column.HANDLING: ["SKIP" if f else None for f in failed], Column.STAGE: ["decode" if f else None for f in failed],
        Column.RAW_KEY: pa.array([b"k" if f else None for f in failed], pa.binary()),
        Column.RAW_VALUE: pa.array([None] * n, pa.binary()),
        Column.HEADERS: pa.array([None] * n, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        WATERMARK_COLUMN: pa.array([None if t is None else t - 5 for t in times], pa.int64()),
    })


def test_every_change_lands_once_in_its_keys_bucket_with_what_the_stage_reads():
    for seed in [*SEEDS, random.randrange(10**6)]:
        changes = _changes(seed)
        packed = packed_buckets(changes, 16).to_pylist()
        got = []
        for row in packed:
            records = unpack_changes([row[PACKED_CHANGES]])
            assert records and all(set(r) == set(STAGE_FIELDS) for r in records), seed
            assert {spark_bucket(r[GROUP], 16) for r in records} == {row[BUCKET]}, seed
            marks = [changes.column(WATERMARK_COLUMN)[r[Column.OFFSET]].as_py() for r in records]
            assert row[WATERMARK_COLUMN] == max((m for m in marks if m is not None), default=None), seed
            got.extend(records)
        assert len({row[BUCKET] for row in packed}) == len(packed), seed  # one row per bucket
        assert sorted(r[Column.OFFSET] for r in got) == list(range(changes.num_rows)), seed
        for record in got:
            source = {name: changes.column(name)[record[Column.OFFSET]].as_py() for name in changes.schema.names}
            expected_group = source[Column.KEY] if source[Column.ERROR] is None \
                else f"{ERROR_PREFIX}t:{seed % 4}:{source[Column.OFFSET]}"
            assert record[GROUP] == expected_group, seed
            assert record[EVENT_TIME] == (source[Column.EVENT_TIME] if source[Column.EVENT_TIME] is not None
                                          else source[Column.TIMESTAMP]), seed
            assert all(record[name] == source[name] for name in STAGE_FIELDS if name not in (GROUP, EVENT_TIME)), seed


def test_a_range_is_decoded_then_packed():
    pipeline = PipelineSettings(name="p", topics=["a"], table="t", primary_key=["id"], on_conflict="error")
    values = [{"op": "c", "before": None, "after": {"id": i, "v": i}} for i in range(20)]
    batches = [_records("a", values[:10], 0), _records("a", values[10:], 10)]
    decoded = DecodedRanges(pipeline, None)
    rows = pa.Table.from_batches(list(decoded(lambda: iter(batches)))).to_pylist()  # type: ignore[arg-type]
    packed = list(PackedBuckets(decoded, 4)(lambda: iter(batches)))  # type: ignore[arg-type]
    assert len(packed) == 2  # one packed batch per decoded chunk
    records = unpack_changes(v for batch in packed for v in batch.column(PACKED_CHANGES).to_pylist())
    assert sorted((r[Column.OFFSET], r[Column.ROW]) for r in records) == [(r[Column.OFFSET], r[Column.ROW]) for r in rows]
