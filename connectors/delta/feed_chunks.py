"""Bounded row chunks of a Delta change feed: a commit larger than a micro-batch is split at key boundaries.

With `maxRowsPerTrigger` the change-feed source orders each version's rows canonically, by
the key columns and then the side (`update_preimage` / `delete` before `insert` /
`update_postimage`), and numbers them from 0 (`_commit_row`). An offset is then a place in
that order, `(version, row)`: the next row to read. Offsets are only ever placed where a key's
run of rows starts, so the -U and +U rows of one update (one key, one version) never land in
different micro-batches. A batch holds at most `maxRowsPerTrigger` rows, except that a batch
always makes progress: when the next key's run alone is larger, it holds that run.

The driver plans with the key columns of a version only (`VersionLayout`: where key runs
start), read once per version and kept for the versions being split. An executor reads a
version it has all rows of as a whole; of a split version it reads the key columns, picks the
keys of its row range, and streams the version's rows keeping those keys only
(`chunk_of_version`), so its memory follows the chunk, not the commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.delta.arrow_types import one_array

CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
COMMIT_ROW = "_commit_row"
_SIDE = "__side"
_INDEX = "__index"
_MIN_BLOCK_ROWS = 65_536
_BEFORE_SIDE = ("update_preimage", "delete")
Offset = tuple[int, int]  # (version, row): the next row to read


_VIEWS = (pa.types.is_string_view, pa.types.is_binary_view)


def _take_views(column: pa.ChunkedArray, indices: np.ndarray) -> pa.Array:
    """A string or binary view column's rows at `indices`, sharing the column's data buffers.

    Arrow has no take or filter kernel for views; a view is 16 bytes, so this takes the views
    with numpy and leaves the values where they are (a cast to string copies every value)."""
    array = one_array(column)
    buffers = array.buffers()
    views = np.frombuffer(buffers[1], dtype=np.int64).reshape(-1, 2)[array.offset:array.offset + len(array)]
    validity, nulls = None, 0
    if array.null_count:
        valid = array.is_valid().to_numpy(zero_copy_only=False)[indices]
        nulls = int(len(valid) - np.count_nonzero(valid))
        validity = pa.array(valid).buffers()[1] if nulls else None
    return pa.Array.from_buffers(array.type, len(indices), [validity, pa.py_buffer(views[indices]), *buffers[2:]],
                                 null_count=nulls)


def take_rows(table: pa.Table, indices: np.ndarray | pa.Array) -> pa.Table:
    """`table.take(indices)`, also for delta-rs's string and binary view columns (top level only)."""
    if not any(is_view(f.type) for f in table.schema for is_view in _VIEWS):
        return table.take(indices)
    at = indices.to_numpy(zero_copy_only=False) if isinstance(indices, (pa.Array, pa.ChunkedArray)) else indices
    at = np.asarray(at, dtype=np.int64)
    columns = [_take_views(column, at) if any(is_view(column.type) for is_view in _VIEWS) else column.take(at)
               for column in table.columns]
    return pa.Table.from_arrays(columns, schema=table.schema)


def _as_types(column: pa.ChunkedArray, name: str, types: pa.Schema | None) -> pa.ChunkedArray:
    """`column` in the type `types` gives its name (as it is when `types` has no such column)."""
    if types is None or types.get_field_index(name) < 0 or column.type == types.field(name).type:
        return column
    return column.cast(types.field(name).type)


def _canonical_indices(feed: pa.Table, key_columns: tuple[str, ...], key_types: pa.Schema | None = None) -> pa.Array:
    side = pc.invert(pc.is_in(feed.column(CHANGE_TYPE).cast(pa.string()), value_set=pa.array(_BEFORE_SIDE)))
    names = [c for c in (COMMIT_VERSION, *key_columns) if c in feed.column_names]
    sortable = pa.table([_as_types(feed.column(c), c, key_types) for c in names], names=names)
    sortable = sortable.append_column(_SIDE, side)
    return pc.sort_indices(sortable, [(c, "ascending") for c in sortable.column_names])


def canonical_order(feed: pa.Table, key_columns: tuple[str, ...], key_types: pa.Schema | None = None) -> pa.Table:
    """Rows sorted by (version if present, key columns, before side first).

    `key_types`: the types the key columns are compared in (a raw delta-rs feed sorted as its
    conformed copy would be, so the order is the planning's whatever the raw types)."""
    return take_rows(feed, _canonical_indices(feed, key_columns, key_types))


def run_start_mask(table: pa.Table) -> np.ndarray:
    """True where a row of a sorted table starts a run of rows equal in every column."""
    rows = table.num_rows
    starts = np.ones(rows, dtype=bool)
    if rows < 2:
        return starts
    differs = np.zeros(rows - 1, dtype=bool)
    for column in table.columns:
        column = column.combine_chunks()
        differs |= pc.not_equal(column.slice(1), column.slice(0, rows - 1)).to_numpy(zero_copy_only=False)
    starts[1:] = differs
    return starts


@dataclass(frozen=True)
class VersionLayout:
    """A version's feed in canonical order, as places where a key's run starts (the last is the row count)."""

    boundaries: np.ndarray

    @property
    def rows(self) -> int:
        return int(self.boundaries[-1])

    @classmethod
    def of(cls, keys_and_types: pa.Table, key_columns: tuple[str, ...]) -> "VersionLayout":
        """The layout from a version's key columns and change types."""
        if keys_and_types.num_rows == 0:
            return cls(np.zeros(1, dtype=np.int64))
        ordered = canonical_order(keys_and_types, key_columns)
        starts = np.flatnonzero(run_start_mask(ordered.select(list(key_columns))))
        return cls(np.append(starts, ordered.num_rows))

    def stop(self, row: int, budget: int, taken: int) -> int:
        """Where a batch that reached `row` with `budget` rows left stops in this version (a boundary)."""
        bounds = self.boundaries
        last = bounds[np.searchsorted(bounds, row + budget, side="right") - 1]
        if last > row or taken:
            return int(max(last, row))
        return int(bounds[np.searchsorted(bounds, row, side="right")])  # one run beyond the budget


def chunk_end(begin: Offset, following: int, max_rows: int, max_versions: int | None,
              layout: Callable[[int], VersionLayout]) -> Offset:
    """The end of the next batch from `begin`: at most `max_rows` rows and `max_versions` versions."""
    version, row = begin
    budget, taken, versions = max_rows, 0, 0
    while version < following and (max_versions is None or versions < max_versions):
        versions += 1
        size = layout(version).rows
        if size - row <= budget:
            budget, taken, version, row = budget - (size - row), taken + size - row, version + 1, 0
            continue
        stop = layout(version).stop(row, budget, taken)
        return (version + 1, 0) if stop >= size else (version, stop)
    return version, row


def number_rows(feed: pa.Table) -> pa.Table:
    """A canonically ordered feed with `_commit_row`, each row's place in its version."""
    versions = feed.column(COMMIT_VERSION).to_numpy()
    if len(versions) == 0:
        return feed.append_column(COMMIT_ROW, pa.array([], pa.int64()))
    first = np.flatnonzero(np.concatenate(([True], versions[1:] != versions[:-1])))
    version_start = np.repeat(first, np.diff(np.append(first, len(versions))))
    return feed.append_column(COMMIT_ROW, pa.array(np.arange(len(versions)) - version_start))


def _blocks(batches: Iterable[pa.Table], rows: int) -> Iterator[pa.Table]:
    """The batches regrouped into tables of at least `rows` rows (the last may be smaller)."""
    pending: list[pa.Table] = []
    size = 0
    for batch in batches:
        pending.append(batch)
        size += batch.num_rows
        if size >= rows:
            yield pa.concat_tables(pending)
            pending, size = [], 0
    if pending:
        yield pa.concat_tables(pending)


def rows_of_keys(batches: Iterable[pa.Table], keys: pa.Table, schema: pa.Schema) -> pa.Table:
    """The rows of `batches` whose key columns equal a row of `keys` (a semi-join on the key columns only).

    Joined a block at a time, each block about as large as `keys`: a join per small batch costs
    more in setting up than in matching. The batches may be raw (their key columns are compared
    in the types of `keys`); `schema` is the empty result's.
    """
    names = keys.column_names
    parts = []
    for block in _blocks(batches, max(keys.num_rows, _MIN_BLOCK_ROWS)):
        block_keys = [_as_types(block.column(c), c, keys.schema) for c in names]
        if len(names) == 1:  # a hash set lookup: cheaper than a join
            kept = pc.is_in(block_keys[0], value_set=keys.column(0).combine_chunks())
            parts.append(take_rows(block, np.flatnonzero(kept.to_numpy(zero_copy_only=False))))
            continue
        index = pa.table([*block_keys, pa.array(np.arange(block.num_rows, dtype=np.int64))], names=[*names, _INDEX])
        hits = index.join(keys, names, join_type="left semi").column(_INDEX)
        parts.append(take_rows(block, hits))
    return pa.concat_tables(parts, promote_options="permissive") if parts else schema.empty_table()


def chunk_of_version(keys_and_types: pa.Table, batches: Iterable[pa.Table], schema: pa.Schema,
                     key_columns: tuple[str, ...], start_row: int, end_row: int) -> pa.Table:
    """Rows [start_row, end_row) of one version (end_row 0: to its end), canonically ordered and numbered.

    `keys_and_types` is the version's key columns and change types; `batches` its rows in `schema`.
    """
    return chunk_and_rest(keys_and_types, batches, schema, key_columns, start_row, end_row)[0]


def chunk_and_rest(keys_and_types: pa.Table, batches: Iterable[pa.Table], schema: pa.Schema,
                   key_columns: tuple[str, ...], start_row: int, end_row: int,
                   ahead: int = 0, finish: Callable[[pa.Table], pa.Table] | None = None) -> tuple[pa.Table, pa.Table]:
    """`chunk_of_version`'s rows, and the version's next `ahead` rows after them from the same read.

    Both canonically ordered and numbered, each its own copy (the rest holds no buffer of the
    chunk). The rest ends anywhere, not at a key boundary: use it only up to a later chunk's end.
    With `finish` the batches are raw rows (e.g. delta-rs's string views) that are kept and
    ordered as they are, and `finish` (conforming them to `schema`) runs on each part once: the
    wide values are copied once, not per step.
    """
    ordered = canonical_order(keys_and_types, key_columns)
    stop = ordered.num_rows if end_row == 0 else end_row
    further = min(stop + ahead, ordered.num_rows)
    wanted = ordered.slice(start_row, further - start_row).select(list(key_columns))
    rows = rows_of_keys(batches, wanted, schema)
    order = _canonical_indices(rows, key_columns, wanted.schema).to_numpy()
    cut = stop - start_row
    parts = []
    for first, indices in ((start_row, order[:cut]), (stop, order[cut:further - start_row])):
        part = take_rows(rows, indices)
        if finish is not None:
            part = finish(part)
        parts.append(part.append_column(COMMIT_ROW, pa.array(np.arange(first, first + part.num_rows,
                                                                      dtype=np.int64))))
    return parts[0], parts[1]


class VersionRest:
    """The rows of a split version read ahead of its next chunk, so that chunk does not stream the version again.

    Holds at most one version's rows [first, first + n) in canonical order with `_commit_row`;
    `take` hands out a later chunk [first, end) lying inside them, once, and keeps the rows after
    it for the chunk after (a short last chunk does not stream the version again)."""

    def __init__(self) -> None:
        self._where: tuple[str, int] | None = None
        self._rows: pa.Table | None = None
        self._to_end = False

    def take(self, table: str, version: int, start_row: int, end_row: int) -> pa.Table | None:
        """Rows [start_row, end_row) of the version if held (end_row 0: to the version's end), else None."""
        rows, to_end = self._rows, self._to_end
        if rows is None or self._where != (table, version) or rows.num_rows == 0:
            return None
        first = rows.column(COMMIT_ROW)[0].as_py()
        self.drop()
        if start_row != first:
            return None
        if end_row == 0:
            return rows if to_end else None
        if end_row > first + rows.num_rows:
            return None
        if end_row < first + rows.num_rows:  # the rows after this chunk stay for the next one
            self.keep(table, version, rows.slice(end_row - start_row), to_end)
        return rows.slice(0, end_row - start_row)

    def keep(self, table: str, version: int, rows: pa.Table, to_end: bool) -> None:
        """Hold `rows` of the version; `to_end`: they reach the version's last row."""
        self._where, self._rows, self._to_end = (table, version), rows, to_end

    def drop(self) -> None:
        self._where, self._rows, self._to_end = None, None, False
