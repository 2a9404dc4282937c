"""Every row of a Delta table (or those a filter passes) as Arrow batches in the table's schema, on either
kind of table: deltalake's pyarrow dataset where it can read the table, delta-rs's query engine (DataFusion)
where the table may hold deletion vectors, which the pyarrow dataset refuses to read."""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, QueryBuilder

__all__ = ["may_hold_deletion_vectors", "scan"]


def may_hold_deletion_vectors(table: DeltaTable) -> bool:
    """The table's protocol lets its files carry deletion vectors."""
    return "deletionVectors" in (table.protocol().reader_features or ())


def scan(table: DeltaTable, where: pc.Expression | None = None) -> pa.RecordBatchReader:
    """The table's live rows (those `where` passes) in its Arrow schema."""
    if not may_hold_deletion_vectors(table):
        return table.to_pyarrow_dataset().scanner(filter=where).to_reader()
    schema = pa.schema(table.schema().to_arrow())
    found = pa.RecordBatchReader.from_stream(QueryBuilder().register("t", table).execute("SELECT * FROM t"))

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in found:
            rows = pa.Table.from_batches([batch.cast(schema)])  # the engine's string views as the table's types
            if where is not None:
                rows = rows.filter(where)
            yield from rows.to_batches()

    return pa.RecordBatchReader.from_batches(schema, batches())
