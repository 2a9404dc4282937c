"""A Kafka range's reducer for ranges that may be pieces of one partition's range.

A range reduced record by record applies a source TRUNCATE to its own earlier changes and says
only that it read one (`truncated`). When the partition was read in pieces
(`connectors.kafka.offsets.split_spans`), the changes of the earlier pieces must be wiped as well,
as they would be were the range read whole: the payload gets a TRUNCATE marker (`truncates`, as
the vectorised way gives its odd records) at the offset before the piece's first record, which
the driver applies to every range of the partition (`batch_changes.without_truncated`). The
piece's own changes after the TRUNCATE are already what survives of it, and later pieces start
after it, so neither is touched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa

from connectors.kafka.range_reader import ValueChunk
from service.kafka_to_delta.materialize.payload import payload_batch, payload_table
from service.kafka_to_delta.rows.names import Column, Part
from service.kafka_to_delta.rows.payload_spool import PayloadSpool, resolved
from service.kafka_to_delta.source.partition_changes import PartitionReducer


class PieceReducer(PartitionReducer):
    """`PartitionReducer` whose payloads mark a TRUNCATE for the earlier pieces of its partition."""

    def __call__(self, read: Callable[[], Iterable[pa.RecordBatch]],
                 read_values: Callable[[], Iterable[ValueChunk]] | None = None) -> Iterator[pa.RecordBatch]:
        first: list[tuple[str, int, int]] = []

        def observed() -> Iterator[pa.RecordBatch]:
            for batch in read():
                if not first and batch.num_rows:
                    first.append((batch.column(Column.TOPIC)[0].as_py(), batch.column(Column.PARTITION)[0].as_py(),
                                  batch.column(Column.OFFSET)[0].as_py()))
                yield batch

        for payload in super().__call__(observed, read_values):
            yield _marked(payload, first[0], self.spool) if first else payload


def _marked(batch: pa.RecordBatch, first: tuple[str, int, int], spool: PayloadSpool | None) -> pa.RecordBatch:
    """The payload rows, a changes payload that read a TRUNCATE without a marker given one."""
    parts = batch.column("part").to_pylist()
    payloads = batch.column("payload").to_pylist()
    for index, (part, payload) in enumerate(zip(parts, payloads)):
        if part != Part.CHANGES:
            continue
        table, info = payload_table(resolved(payload))
        if info.get("truncated") and "truncates" not in info:
            topic, partition, offset = first
            info = {**info, "truncates": [[topic, partition, offset - 1]]}
            payloads[index] = payload_batch(table, [], info, spool=spool).column("payload")[0].as_py()
    return pa.RecordBatch.from_arrays([pa.array(parts, pa.string()), pa.array(payloads, pa.binary())],
                                      schema=batch.schema)
