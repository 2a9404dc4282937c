"""Kafka record batches as `read_values(keep_records=True)` gives them, without a broker."""

from __future__ import annotations

import pyarrow as pa

from connectors.kafka.range_reader import FLOOR_COLUMN, ValueChunk


class Record:
    """One record of a batch, answering as a consumer's message does (what `ValueChunk.records` reads)."""

    def __init__(self, row: dict) -> None:
        self.row = row

    def key(self) -> bytes | None:
        return self.row["key"]

    def value(self) -> bytes | None:
        return self.row["value"]

    def timestamp(self) -> tuple[int, int | None]:
        at = self.row["timestamp"]
        return 1, None if at is None else int(at.timestamp() * 1000)

    def headers(self) -> list | None:
        return None if self.row["headers"] is None else [(h["key"], h["value"]) for h in self.row["headers"]]


def chunk_of(batch: pa.RecordBatch) -> ValueChunk:
    """`batch` as `read_values(keep_records=True)` gives it."""
    chunk = ValueChunk.of_batch(batch)
    chunk.messages = [Record(row) for row in batch.to_pylist()]
    chunk.floor = batch.column(FLOOR_COLUMN)[0].as_py() if FLOOR_COLUMN in batch.schema.names and batch.num_rows \
        else None
    return chunk
