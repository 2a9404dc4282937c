"""A micro-batch's changelog rows packed per key bucket where they are decoded: the input of the
materializer's bucket stage (`materializer_buckets`).

Row by row, each change crossed the JVM several times on its way to its bucket's Python call: out
of the decode task into rows, through the shuffle and the stateful operator's sort by bucket, into
Arrow for the bucket's Python worker and into pandas there. Packed, each decoded chunk leaves its
task as one row per bucket it touches: the bucket, the largest watermark candidate of the bucket's
rows (so the query's watermark is what it was row by row: the largest candidate) and the rows
themselves as one Arrow IPC value, which the bucket call reads back with `unpack_changes`; typed image
columns, where the decode carries them, go with the rows.

The bucket is Spark's own `pmod(xxhash64(group key), N)` (`spark_bucket`): the function the rows
were bucketed with before they were packed and that the seed of `rebuild-state` still uses, so a
key always meets its state. `tests/integration/service/kafka_to_delta/source/test_bucket_packing.py` checks it against Spark.

Used when the materializer reads the decoded changes directly (no stateful FROM_CHANGELOG stage in
front, whose rows are one per change) and keeps its state per bucket.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from connectors.kafka.range_reader import ValueChunk
from service.kafka_to_delta.rows.ipc import ipc_bytes
from service.kafka_to_delta.rows.names import (
    BUCKET,
    EVENT_TIME,
    GROUP,
    PACKED_CHANGES,
    STAGE_FIELDS,
    WATERMARK_COLUMN,
    Column,
    error_group_key,
    typed_names,
)
from service.kafka_to_delta.source.decode_stage import DecodedRanges

_SPARK_XXHASH_SEED = 42
_UNSIGNED = 1 << 64
_SIGNED_TOP = 1 << 63


def spark_bucket(group: str | None, buckets: int) -> int:
    """Spark's `pmod(xxhash64(group), buckets)` for a string (a null hashes to the seed)."""
    hashed = _SPARK_XXHASH_SEED if group is None else xxhash.xxh64_intdigest(group.encode(), _SPARK_XXHASH_SEED)
    if hashed >= _SIGNED_TOP:
        hashed -= _UNSIGNED  # Spark's hash is a signed long
    return hashed % buckets  # Python's modulo of a positive divisor is Spark's pmod


def group_keys(changes: pa.RecordBatch) -> list[str | None]:
    """Each row's group key: its primary key text, or for a row that failed an earlier stage, a key
    of its own from its coordinates (as `materializer_stage` computes it in Spark)."""
    keys = changes.column(Column.KEY).to_pylist()
    errors = changes.column(Column.ERROR)
    if errors.null_count == len(errors):
        return keys
    coordinates = zip(*(changes.column(name).to_pylist() for name in (Column.TOPIC, Column.PARTITION, Column.OFFSET)))
    return [key if error is None else error_group_key(f"{topic}:{partition}:{offset}")
            for key, error, (topic, partition, offset) in zip(keys, errors.to_pylist(), coordinates)]


def packed_buckets(changes: pa.RecordBatch, buckets: int, labels: tuple[int, ...] | None = None) -> pa.RecordBatch:
    """One decoded chunk (changelog rows and `WATERMARK_COLUMN`) as one row per key bucket it touches, each
    under its bucket's label (`labels`; None: the bucket's number)."""
    groups = group_keys(changes)
    bucket_of = np.fromiter((spark_bucket(g, buckets) for g in groups), np.int64, len(groups))
    if labels is not None:
        bucket_of = np.asarray(labels, np.int64)[bucket_of]
    event_time = pc.coalesce(changes.column(Column.EVENT_TIME), changes.column(Column.TIMESTAMP))
    columns = {GROUP: pa.array(groups, pa.string()), EVENT_TIME: event_time}
    names = (*STAGE_FIELDS, *typed_names(changes.schema.names))
    rows = pa.table({name: columns[name] if name in columns else changes.column(name) for name in names})
    # One stable sort by bucket, then a slice per bucket (a take per bucket cost 16 passes over the chunk).
    order = pa.array(np.argsort(bucket_of, kind="stable"))
    rows, candidates = rows.take(order), changes.column(WATERMARK_COLUMN).take(order)
    buckets_in_order, counts = np.unique(bucket_of, return_counts=True)
    starts = np.cumsum(counts) - counts  # where each bucket begins in the sorted rows
    out_marks, out_changes = [], []
    for start, count in zip(starts.tolist(), counts.tolist()):
        out_marks.append(pc.max(candidates.slice(start, count)).as_py())
        out_changes.append(ipc_bytes(rows.slice(start, count)))
    return pa.RecordBatch.from_arrays(
        [pa.array(buckets_in_order, pa.int64()), pa.array(out_marks, pa.int64()), pa.array(out_changes, pa.binary())],
        names=[BUCKET, WATERMARK_COLUMN, PACKED_CHANGES],
    )


class PackedBuckets:
    """What a Kafka range becomes where it is read for the bucket stage (`changes_source` with
    `PACKED_SPARK_SCHEMA`): its decoded changes, packed per key bucket. Picklable."""

    def __init__(self, decoded: DecodedRanges, buckets: int, labels: tuple[int, ...] | None = None) -> None:
        self.decoded = decoded
        self.buckets = buckets
        self.labels = labels

    def __call__(self, read: Callable[[], Iterable[pa.RecordBatch]],
                 read_values: Callable[..., Iterable[ValueChunk]] | None = None) -> Iterator[pa.RecordBatch]:
        """The range's packed chunks (`read` yields its record batches)."""
        for changes in self.decoded(read, read_values):
            if changes.num_rows:
                yield packed_buckets(changes, self.buckets, self.labels)
