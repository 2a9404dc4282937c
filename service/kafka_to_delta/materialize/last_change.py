"""The last change per key of rows in source order, in Arrow."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

MAX_PIECES = 32
"""Record batches a taken table may keep; one with more is joined into one: every later compute call
on it pays per batch, and a range's net rows are taken again at each reduction."""


def last_rows(table: pa.Table, key: str) -> pa.Table:
    """The last row of each `key` value (rows in source order), kept in source order.

    Where no key repeats, that is the table itself, returned without a copy. Otherwise the rows
    kept are taken chunk by chunk (`taken_in_order`)."""
    if table.num_rows == 0:
        return table
    positions = last_positions(table.column(key))
    if len(positions) == table.num_rows:
        return table
    return taken_in_order(table, positions)


def last_positions(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The position of each value's last occurrence in `keys`, ascending."""
    grouped = pa.table({"k": keys, "i": pa.array(np.arange(len(keys), dtype=np.int64))}).group_by(
        "k", use_threads=False).aggregate([("i", "max")])
    return np.sort(grouped.column("i_max").to_numpy())


def taken_in_order(table: pa.Table, positions: np.ndarray) -> pa.Table:
    """`table.take(positions)` for ascending `positions`, one take per record batch of the table.

    A take from a table of several chunks first joins each column's chunks into one array, a copy
    of every row, kept or not; taken batch by batch, only the rows kept are copied, once."""
    batches = table.to_batches()
    if len(batches) <= 1:
        return table.take(pa.array(positions))
    ends = np.cumsum([batch.num_rows for batch in batches])
    cuts = np.searchsorted(positions, ends)  # where each batch's positions end
    pieces, first, start = [], 0, 0
    for batch, cut, end in zip(batches, cuts.tolist(), ends.tolist()):
        if cut > first:
            pieces.append(batch.take(pa.array(positions[first:cut] - start)))
        first, start = cut, end
    taken = pa.Table.from_batches(pieces, schema=table.schema)
    return taken.combine_chunks() if len(pieces) > MAX_PIECES else taken
