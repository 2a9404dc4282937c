"""The rows of a Delta table's data files as the small commits read them (`small_commit`): the files a
batch's keys may be in, their rows (all of them, or only those holding a key of the batch), each with its
file and its position in it, the rows a file's deletion vector marks left out, in the table's schema (a
file written before a column was added has it null). The rows of files the commits wrote are kept in
memory for the next batch (`KEPT`)."""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from threading import Lock
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from connectors.delta.deletion_vectors import Descriptor, positions

__all__ = ["FILE", "KEPT", "KEPT_ROWS_BYTES", "POSITION", "DataFile", "KeptRows", "candidates", "conformed",
           "file_rows", "matched_rows", "read_rows", "remaining_rows"]

FILE = "__file"
"""The column of the index of a row's file (in the list of files read)."""
POSITION = "__position"
"""The column of a row's position in its file."""
_ROW = "__data_file_row"

KEPT_ROWS_BYTES = 64 * 1024 * 1024
"""The rows of data files the small commits wrote are kept for the next batch up to this much memory in all
(the process's tables together), those written last first."""


@dataclass(frozen=True)
class DataFile:
    """One data file of the table: its log path, size, and (min, max) of the columns with statistics."""

    path: str
    size: int
    bounds: dict[str, tuple[object, object]]
    vector: Descriptor | None = None
    """Its deletion vector."""
    stats: str | None = None
    """Its statistics as the log holds them (kept where a commit adds a deletion vector to it)."""
    modified: int = 0


def candidates(files: list[DataFile], changes: pa.Table, primary_key: tuple[str, ...]) -> list[DataFile]:
    """The table's files whose key statistics do not rule out every key of the batch."""
    bounds = {name: pc.min_max(changes.column(name)).as_py() for name in primary_key}

    def may_hold(file: DataFile) -> bool:
        for name, (low, high) in file.bounds.items():
            wanted = bounds.get(name)
            if wanted is None or wanted["min"] is None:
                continue
            try:
                if high < wanted["min"] or low > wanted["max"]:
                    return False
            except TypeError:  # statistics this module cannot compare (e.g. zoned and plain times)
                continue
        return True

    return [file for file in files if may_hold(file)]


class KeptRows:
    """Rows of written data files by (table root, path), at most `KEPT_ROWS_BYTES` in all, least
    recently used out first. A data file never changes, so an entry is never stale; one no table
    lists any more ages out."""

    def __init__(self) -> None:
        self._rows: OrderedDict[tuple[str, str], pa.Table] = OrderedDict()
        self._bytes = 0
        self._lock = Lock()

    def get(self, root: str, path: str) -> pa.Table | None:
        with self._lock:
            rows = self._rows.get((root, path))
            if rows is not None:
                self._rows.move_to_end((root, path))
            return rows

    def put(self, root: str, path: str, rows: pa.Table) -> None:
        """Keep `rows` (as one chunk: a take from several chunks joins each column's chunks again)."""
        if rows.nbytes > KEPT_ROWS_BYTES:
            return
        rows = rows.combine_chunks()
        with self._lock:
            self._rows[(root, path)] = rows
            self._bytes += rows.nbytes
            while self._bytes > KEPT_ROWS_BYTES:
                _, dropped = self._rows.popitem(last=False)
                self._bytes -= dropped.nbytes

    def drop(self, root: str, path: str) -> None:
        with self._lock:
            rows = self._rows.pop((root, path), None)
            if rows is not None:
                self._bytes -= rows.nbytes


KEPT = KeptRows()


def read_rows(root: str, files: list[DataFile], schema: pa.Schema) -> tuple[pa.Table, list[int]]:
    """The live rows of `files` in the table's schema (kept ones from memory; those a file's deletion
    vector marks left out), each with its file's index (`FILE`) and its position in that file
    (`POSITION`); and each file's number of rows."""
    parts, counts = [], []
    for index, file in enumerate(files):
        rows = KEPT.get(root, file.path)
        if rows is None:
            rows = pq.read_table(os.path.join(root, unquote(file.path)), schema=schema)
        elif rows.schema != schema:  # kept in the schema of its commit, before a column was added
            rows = conformed(rows, schema)
        counts.append(rows.num_rows)
        rows = rows.append_column(FILE, pa.array(np.full(rows.num_rows, index, np.int32)))
        rows = rows.append_column(POSITION, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
        if file.vector is not None:
            live = np.ones(rows.num_rows, bool)
            live[positions(root, file.vector)] = False
            rows = rows.filter(pa.array(live))
        parts.append(rows)
    if not parts:
        empty = schema.empty_table().append_column(FILE, pa.array([], pa.int32()))
        return empty.append_column(POSITION, pa.array([], pa.int64())), counts
    # One chunk: the takes below would otherwise join every column of the chunks for each take.
    return pa.concat_tables(parts).combine_chunks(), counts


def _hits(keys: pa.Table, changes: pa.Table, primary_key: tuple[str, ...]) -> np.ndarray:
    """Whether each row of `keys` (a file's key columns) holds a key of the batch."""
    if len(primary_key) == 1:
        name = primary_key[0]
        return pc.is_in(keys.column(name), value_set=changes.column(name)).to_numpy(zero_copy_only=False)
    numbered = keys.append_column(_ROW, pa.array(np.arange(keys.num_rows)))
    found = numbered.join(changes.select(list(primary_key)), keys=list(primary_key), join_type="inner")
    hit = np.zeros(keys.num_rows, bool)
    hit[found.column(_ROW).to_numpy()] = True
    return hit


def conformed(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """A data file's rows in the table's schema: a column added after the file was written is null."""
    columns = [rows.column(f.name).cast(f.type) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
               for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def file_rows(root: str, file: DataFile, schema: pa.Schema, wanted: np.ndarray) -> pa.Table:
    """Rows `wanted` (sorted positions) of `file`, reading only the row groups that hold them."""
    source = pq.ParquetFile(os.path.join(root, unquote(file.path)))
    ends = np.cumsum([source.metadata.row_group(i).num_rows for i in range(source.metadata.num_row_groups)])
    groups = np.unique(np.searchsorted(ends, wanted, side="right")).tolist()
    starts = ends - [source.metadata.row_group(i).num_rows for i in range(len(ends))]
    rows = conformed(source.read_row_groups(groups), schema) if groups else schema.empty_table()
    # Positions within the groups read: each group's rows follow the previous group's.
    offset = np.zeros(len(ends), np.int64)
    offset[groups] = np.cumsum([0] + [int(ends[g] - starts[g]) for g in groups[:-1]])
    group_of = np.searchsorted(ends, wanted, side="right")
    return rows.take(pa.array(wanted - starts[group_of] + offset[group_of]))


def matched_rows(root: str, files: list[DataFile], schema: pa.Schema, changes: pa.Table,
             primary_key: tuple[str, ...]) -> tuple[pa.Table, list[int], dict[int, np.ndarray]]:
    """The live rows of `files` holding a key of the batch (with `FILE` and `POSITION` as `read_rows`'s),
    each file's number of rows, and the positions its deletion vector marks. Only the key columns of a
    file are read to find them, then the rows found (from memory where kept)."""
    parts, counts, marked = [], [], {}
    names = list(primary_key)
    for index, file in enumerate(files):
        rows = KEPT.get(root, file.path)
        if rows is not None:
            keys = rows.select(names)
        else:
            keys = pq.read_table(os.path.join(root, unquote(file.path)), columns=names,
                                 schema=pa.schema([schema.field(n) for n in names]))
        counts.append(keys.num_rows)
        hit = _hits(keys, changes, primary_key)
        marked[index] = positions(root, file.vector)
        hit[marked[index]] = False
        wanted = np.flatnonzero(hit)
        if not len(wanted):
            continue
        found = conformed(rows.take(pa.array(wanted)), schema) if rows is not None else file_rows(
            root, file, schema, wanted)
        found = found.append_column(FILE, pa.array(np.full(len(wanted), index, np.int32)))
        parts.append(found.append_column(POSITION, pa.array(wanted)))
    if not parts:
        empty = schema.empty_table().append_column(FILE, pa.array([], pa.int32()))
        return empty.append_column(POSITION, pa.array([], pa.int64())), counts, marked
    return pa.concat_tables(parts).combine_chunks(), counts, marked


def remaining_rows(root: str, files: list[DataFile], schema: pa.Schema, gone: dict[int, np.ndarray]) -> pa.Table:
    """The rows of the files `gone` names that none of its positions marks: what stays of a file that is
    rewritten instead of marked (most of its rows are gone), in the table's schema."""
    parts = []
    for index, positions_gone in gone.items():
        file = files[index]
        rows = KEPT.get(root, file.path)
        if rows is None:
            rows = pq.read_table(os.path.join(root, unquote(file.path)))
        live = np.ones(rows.num_rows, bool)
        live[positions_gone] = False
        parts.append(conformed(rows.filter(pa.array(live)), schema))
    return pa.concat_tables(parts)
