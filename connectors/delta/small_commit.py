"""A small MERGE as one copy-on-write commit computed in Arrow: the fast path of `DeltaRsTable.merge`.

delta-rs's MERGE costs about 29 ms of CPU however few rows it touches (planning and running a
DataFusion join, its writers, its commit); a database source commits each of its tables every
micro-batch, so 200 tables pay it 200 times a batch. Where a batch fits (below), this module does
what that MERGE does, with the same meaning (`merge_plan`): it reads the data files the batch's
keys may be in (by the files' key statistics), applies the changes in Arrow (delete where flagged,
update keeping the stored value of a kept column and of a column the batch lacks, insert the rest),
writes the rewritten rows as one new data file and the changes as one change-data file (the
`_change_type` values delta-rs writes), and commits `commitInfo`, `txn` (application id + batch id),
`add`, `cdc` and `remove` as the table's next log entry. The entry is created only if it does not
exist (a hard link of a written file), so another writer's commit of that version makes this one
give way (`False`) to the MERGE, which resolves the conflict as it always did.

The table's state this needs (version, schema, files with their key statistics, the application
transactions it was asked about) is kept between batches (`SmallCommits`), built from a delta-rs
handle once and then advanced by its own commits: a steady batch reads no log. It is current while
the log has no entry after its version (one `stat`); any other commit (another writer, OPTIMIZE,
the MERGE) makes it load again. The rows of the data files it wrote are kept too (`KEPT_ROWS_BYTES`
in all), so the next batch does not read them back.

The MERGE stays the reference: `tests/integration/connectors/delta/test_small_commit.py` holds the
two equal (table, change feed, transactions) over generated batches, and reads a small commit back
with delta-spark.

A batch fits when:
- the table lives on a local filesystem (an object store has no create-if-absent here);
- the table is unpartitioned, its protocol is reader 1 / writer <= 4 (or writer 7 with no feature
  but `changeDataFeed`), it is not append-only, and has no constraints, invariants or generated
  columns;
- the batch brings no new column, its values convert to the table's types, and no key twice;
- the files it may touch hold at most `MAX_REWRITE_BYTES`.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from threading import Lock
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from connectors.delta.deletion_vectors import Descriptor, positions, write_vectors
from connectors.delta.log_replay import live_files
from connectors.delta.merge_plan import DELETE_FLAG, KEEP_FLAG_PREFIX
from connectors.delta.table_scan import may_hold_deletion_vectors

__all__ = ["MAX_READ_BYTES", "MAX_REWRITE_BYTES", "SmallCommits", "Snapshot"]

MAX_REWRITE_BYTES = 16 * 1024 * 1024
"""Above this many bytes of data files to rewrite, the commit's own cost no longer dominates: MERGE."""
MAX_READ_BYTES = 256 * 1024 * 1024
"""Marking rows deleted (deletion vectors) rewrites nothing, but the files a batch may touch are still read
whole (the stored rows of updated keys): above this many bytes of them, MERGE."""
KEPT_ROWS_BYTES = 64 * 1024 * 1024
"""The rows of data files this module wrote are kept for the next batch up to this much memory in all
(the process's tables together), those written last first."""
_CHANGE_TYPE = "_change_type"
_ROW = "__small_commit_row"
_CHANGE = "__small_commit_change"
_FILE = "__file"
_POSITION = "__position"
_STATS_TYPES = (pa.types.is_integer, pa.types.is_date32, pa.types.is_string, pa.types.is_large_string)
_STRING_STATS_CHARS = 32
_WRITER_FEATURES = {"changeDataFeed", "deletionVectors", "appendOnly", "invariants"}
"""Writer features a small commit honours: the change feed, deletion vectors, and two whose use the
metadata check refuses (`delta.appendOnly`, invariants)."""
_READER_FEATURES = {"deletionVectors"}
_VARIANT = "variantType"
"""Listed by delta-rs on every table it creates at reader version 3; fine while no column is a variant."""
_ENGINE = "cdc-lakehouse small commit"


def local_root(uri: str) -> str | None:
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return unquote(parsed.path) if parsed.scheme else uri
    return None


def _protocol_fits(handle: DeltaTable) -> bool:
    protocol = handle.protocol()
    readers, writers = set(protocol.reader_features or ()), set(protocol.writer_features or ())
    if _VARIANT in readers | writers:
        if '"variant"' in handle.schema().to_json():
            return False
        readers.discard(_VARIANT)
        writers.discard(_VARIANT)
    if protocol.min_reader_version == 2 or (protocol.min_reader_version == 1 and readers):
        return False
    if protocol.min_reader_version > 3 or not readers <= _READER_FEATURES:
        return False
    if protocol.min_writer_version == 7:
        return writers <= _WRITER_FEATURES
    return protocol.min_writer_version <= 4


def _writes_vectors(handle: DeltaTable) -> bool:
    """Commits to the table mark changed rows deleted instead of rewriting their files."""
    enabled = handle.metadata().configuration.get("delta.enableDeletionVectors", "false").lower() == "true"
    return enabled and "deletionVectors" in (handle.protocol().writer_features or ())


def _metadata_fits(handle: DeltaTable, schema: pa.Schema) -> bool:
    metadata = handle.metadata()
    configuration = metadata.configuration
    if metadata.partition_columns or configuration.get("delta.appendOnly", "false").lower() == "true":
        return False
    if any(key.startswith("delta.constraints.") for key in configuration):
        return False
    if configuration.get("delta.columnMapping.mode", "none") != "none":
        return False
    for field in schema:
        keys = {key.decode() if isinstance(key, bytes) else key for key in (field.metadata or {})}
        if keys & {"delta.generationExpression", "delta.invariants", "delta.identity.start"}:
            return False
    return True


def _cdf_enabled(handle: DeltaTable) -> bool:
    return handle.metadata().configuration.get("delta.enableChangeDataFeed", "false").lower() == "true"


def _typed_changes(changes: pa.Table, schema: pa.Schema, data: list[str]) -> pa.Table | None:
    """The batch with its data columns in the table's types (None: a value does not convert)."""
    columns, fields = [], []
    for name in changes.column_names:
        column = changes.column(name)
        if name in data:
            kind = schema.field(name).type
            if column.type != kind:
                try:
                    column = column.cast(kind)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                    return None
            fields.append(pa.field(name, kind))
        else:
            fields.append(changes.schema.field(name))
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _unique_keys(changes: pa.Table, primary_key: tuple[str, ...]) -> bool:
    if len(primary_key) == 1:
        return pc.count_distinct(changes.column(primary_key[0]), mode="all").as_py() == changes.num_rows
    return changes.group_by(list(primary_key)).aggregate([]).num_rows == changes.num_rows


def _candidates(files: list[DataFile], changes: pa.Table, primary_key: tuple[str, ...]) -> list[DataFile]:
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


class _KeptRows:
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
        if rows.nbytes > KEPT_ROWS_BYTES:
            return
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


_KEPT = _KeptRows()


def _read(root: str, files: list[DataFile], schema: pa.Schema) -> tuple[pa.Table, list[int]]:
    """The live rows of `files` in the table's schema (kept ones from memory; those a file's deletion
    vector marks left out), each with its file's index (`_FILE`) and its position in that file
    (`_POSITION`); and each file's number of rows."""
    parts, counts = [], []
    for index, file in enumerate(files):
        rows = _KEPT.get(root, file.path)
        if rows is None:
            rows = pq.read_table(os.path.join(root, unquote(file.path)), schema=schema)
        counts.append(rows.num_rows)
        rows = rows.append_column(_FILE, pa.array(np.full(rows.num_rows, index, np.int32)))
        rows = rows.append_column(_POSITION, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
        if file.vector is not None:
            live = np.ones(rows.num_rows, bool)
            live[positions(root, file.vector)] = False
            rows = rows.filter(pa.array(live))
        parts.append(rows)
    if not parts:
        empty = schema.empty_table().append_column(_FILE, pa.array([], pa.int32()))
        return empty.append_column(_POSITION, pa.array([], pa.int64())), counts
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


def _conformed(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """A data file's rows in the table's schema: a column added after the file was written is null."""
    columns = [rows.column(f.name).cast(f.type) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
               for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def _file_rows(root: str, file: DataFile, schema: pa.Schema, wanted: np.ndarray) -> pa.Table:
    """Rows `wanted` (sorted positions) of `file`, reading only the row groups that hold them."""
    source = pq.ParquetFile(os.path.join(root, unquote(file.path)))
    ends = np.cumsum([source.metadata.row_group(i).num_rows for i in range(source.metadata.num_row_groups)])
    groups = np.unique(np.searchsorted(ends, wanted, side="right")).tolist()
    starts = ends - [source.metadata.row_group(i).num_rows for i in range(len(ends))]
    rows = _conformed(source.read_row_groups(groups), schema) if groups else schema.empty_table()
    # Positions within the groups read: each group's rows follow the previous group's.
    offset = np.zeros(len(ends), np.int64)
    offset[groups] = np.cumsum([0] + [int(ends[g] - starts[g]) for g in groups[:-1]])
    group_of = np.searchsorted(ends, wanted, side="right")
    return rows.take(pa.array(wanted - starts[group_of] + offset[group_of]))


def _matched(root: str, files: list[DataFile], schema: pa.Schema, changes: pa.Table,
             primary_key: tuple[str, ...]) -> tuple[pa.Table, list[int], dict[int, np.ndarray]]:
    """The live rows of `files` holding a key of the batch (with `_FILE` and `_POSITION` as `_read`'s),
    each file's number of rows, and the positions its deletion vector marks. Only the key columns of a
    file are read to find them, then the rows found (from memory where kept)."""
    parts, counts, marked = [], [], {}
    names = list(primary_key)
    for index, file in enumerate(files):
        rows = _KEPT.get(root, file.path)
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
        found = _conformed(rows.take(pa.array(wanted)), schema) if rows is not None else _file_rows(
            root, file, schema, wanted)
        found = found.append_column(_FILE, pa.array(np.full(len(wanted), index, np.int32)))
        parts.append(found.append_column(_POSITION, pa.array(wanted)))
    if not parts:
        empty = schema.empty_table().append_column(_FILE, pa.array([], pa.int32()))
        return empty.append_column(_POSITION, pa.array([], pa.int64())), counts, marked
    return pa.concat_tables(parts).combine_chunks(), counts, marked


def _column_stats(column: pa.ChunkedArray) -> tuple[object, object] | None:
    """(min, max) as the log's statistics write them, or None where this module writes none."""
    kind = column.type
    if not any(test(kind) for test in _STATS_TYPES) or column.null_count == len(column):
        return None
    bounds = pc.min_max(column)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if pa.types.is_date32(kind):
        return low.isoformat(), high.isoformat()
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        if len(high) > _STRING_STATS_CHARS:  # a cut maximum would be below the true one
            return None
        return low[:_STRING_STATS_CHARS], high
    return low, high


def _stats(rows: pa.Table) -> str:
    """numRecords, nullCount of every column, min/max of the integer, date and short string ones."""
    low, high, nulls = {}, {}, {}
    for name in rows.column_names:
        column = rows.column(name)
        if pa.types.is_nested(column.type):
            continue
        nulls[name] = column.null_count
        bounds = _column_stats(column)
        if bounds is not None:
            low[name], high[name] = bounds
    return json.dumps({"numRecords": rows.num_rows, "minValues": low, "maxValues": high, "nullCount": nulls},
                      separators=(",", ":"))


def _write(root: str, folder: str, rows: pa.Table) -> tuple[str, int]:
    """Write `rows` as a new parquet file under `folder` ('' or '_change_data'); (log path, size)."""
    name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    relative = f"{folder}/{name}" if folder else name
    target = os.path.join(root, relative)
    if folder:
        os.makedirs(os.path.dirname(target), exist_ok=True)
    pq.write_table(rows, target, compression="snappy")
    return relative, os.path.getsize(target)


def _matches(stored: pa.Table, changes: pa.Table, primary_key: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(changes' row numbers, stored row numbers) of the pairs with equal keys."""
    if len(primary_key) == 1:
        key = primary_key[0]
        if pc.count_distinct(stored.column(key), mode="all").as_py() == stored.num_rows:
            positions = pc.index_in(changes.column(key), value_set=stored.column(key))
            found = positions.is_valid()
            return (np.flatnonzero(found.to_numpy(zero_copy_only=False)),
                    positions.filter(found).to_numpy(zero_copy_only=False).astype(np.int64))
    numbered = stored.select(list(primary_key)).append_column(_ROW, pa.array(np.arange(stored.num_rows)))
    incoming = changes.select(list(primary_key)).append_column(_CHANGE, pa.array(np.arange(changes.num_rows)))
    pairs = incoming.join(numbered, keys=list(primary_key), join_type="inner")
    return pairs.column(_CHANGE).to_numpy(), pairs.column(_ROW).to_numpy()


@dataclass
class _Changed:
    """What one batch does to the files it touches."""

    rows: pa.Table
    """The new data file's rows: the updated and inserted rows (and, rewriting, the touched files' others)."""
    feed: pa.Table
    """The change-data rows."""
    touched: set[int]
    """The indexes of the files holding a key of the batch."""
    gone: dict[int, np.ndarray]
    """Per touched file, the positions of its rows the batch updates or deletes."""


def _changed_rows(stored: pa.Table, changes: pa.Table, data: list[str], kept: dict[str, str],
                  schema: pa.Schema, primary_key: tuple[str, ...], rewrite: bool) -> _Changed:
    """The batch applied to the rows of the files it may touch (`_read`); with `rewrite`, the touched
    files' rows the batch leaves alone go to the new data file too (copy-on-write)."""
    change_index, row_index = _matches(stored, changes, primary_key)
    deleted = pc.fill_null(changes.column(DELETE_FLAG), False).to_numpy(zero_copy_only=False).astype(bool)
    matched_deleted = deleted[change_index]
    upd_change, upd_row = change_index[~matched_deleted], row_index[~matched_deleted]
    file_of = stored.column(_FILE).to_numpy()
    touched = np.unique(file_of[row_index])
    plain = stored.drop_columns([_FILE, _POSITION])

    before = plain.take(upd_row)
    after_columns = []
    for field in schema:
        if field.name in data:
            values = changes.column(field.name).take(upd_change)
            if field.name in kept:
                flag = pc.fill_null(changes.column(kept[field.name]).take(upd_change), False)
                values = pc.if_else(flag, before.column(field.name), values)
        else:
            values = before.column(field.name)
        after_columns.append(values)
    after = pa.Table.from_arrays(after_columns, schema=schema)

    new = ~deleted
    new[change_index] = False
    fresh = changes.take(np.flatnonzero(new))
    inserted_columns = []
    for field in schema:
        if field.name in data:
            values = fresh.column(field.name)
            if field.name in kept:
                flag = pc.fill_null(fresh.column(kept[field.name]), False)
                values = pc.if_else(flag, pa.nulls(fresh.num_rows, field.type), values)
        else:
            values = pa.nulls(fresh.num_rows, field.type)
        inserted_columns.append(values)
    inserted = pa.Table.from_arrays(inserted_columns, schema=schema)

    parts = [after, inserted]
    if rewrite:
        others = np.isin(file_of, touched)
        others[row_index] = False
        parts.insert(0, plain.filter(pa.array(others)))
    gone_files = file_of[row_index]
    gone_positions = stored.column(_POSITION).to_numpy()[row_index]
    gone = {int(index): np.sort(gone_positions[gone_files == index]) for index in touched.tolist()}

    def typed(rows: pa.Table, kind: str) -> pa.Table:
        return rows.append_column(_CHANGE_TYPE, pa.array([kind] * rows.num_rows, pa.string()))

    feed = pa.concat_tables([typed(plain.take(row_index[matched_deleted]), "delete"),
                             typed(before, "update_preimage"), typed(after, "update_postimage"),
                             typed(inserted, "insert")])
    return _Changed(pa.concat_tables(parts), feed, set(touched.tolist()), gone)


def _key_bounds(rows: pa.Table, primary_key: tuple[str, ...]) -> dict[str, tuple[object, object]]:
    bounds = {}
    for name in primary_key:
        if rows.column(name).null_count == 0:
            low_high = pc.min_max(rows.column(name)).as_py()
            bounds[name] = (low_high["min"], low_high["max"])
    return bounds


def _marked(earlier: dict[int, np.ndarray], counts: list[int], gone: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Per touched file keeping live rows, every position its new deletion vector marks (the earlier
    vector's and the batch's); a file whose rows are all gone is removed instead, so it is left out."""
    marked = {}
    for index in sorted(gone):
        rows = np.union1d(earlier[index], gone[index])
        if len(rows) < counts[index]:
            marked[index] = rows
    return marked


def _rest(root: str, files: list[DataFile], schema: pa.Schema, gone: dict[int, np.ndarray]) -> pa.Table:
    """The rows of the files `gone` names that none of its positions marks: what stays of a file that is
    rewritten instead of marked (most of its rows are gone), in the table's schema."""
    parts = []
    for index, positions_gone in gone.items():
        file = files[index]
        rows = _KEPT.get(root, file.path)
        if rows is None:
            rows = pq.read_table(os.path.join(root, unquote(file.path)))
        live = np.ones(rows.num_rows, bool)
        live[positions_gone] = False
        parts.append(_conformed(rows.filter(pa.array(live)), schema))
    return pa.concat_tables(parts)


def _loose(stats: str | None) -> str | None:
    """A file's statistics once rows of it are marked deleted: its bounds no longer tight."""
    if stats is None:
        return None
    parsed = json.loads(stats)
    parsed["tightBounds"] = False
    return json.dumps(parsed, separators=(",", ":"))


def _add_action(file: DataFile) -> dict:
    add: dict = {"path": file.path, "partitionValues": {}, "size": file.size, "modificationTime": file.modified,
                 "dataChange": True}
    if file.stats is not None:
        add["stats"] = file.stats
    if file.vector is not None:
        add["deletionVector"] = file.vector.action()
    return add


def _entry(actions: list[dict]) -> bytes:
    return "".join(json.dumps(action, separators=(",", ":")) + "\n" for action in actions).encode()


def _create_if_absent(root: str, version: int, body: bytes) -> bool:
    """Create log entry `version` holding `body` unless it exists (False then)."""
    log = os.path.join(root, "_delta_log")
    temporary = os.path.join(log, f".{version:020d}.json.{uuid.uuid4().hex}.tmp")
    with open(temporary, "wb") as out:
        out.write(body)
    try:
        os.link(temporary, os.path.join(log, f"{version:020d}.json"))
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(temporary)


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


def _data_files(actions: pa.Table) -> list[DataFile]:
    """The data files of delta-rs's flattened add actions."""
    names = set(actions.column_names)
    columns = [n[4:] for n in actions.column_names if n.startswith("min.") and f"max.{n[4:]}" in names]
    wanted = ["path", "size_bytes"] + [f"{end}.{n}" for n in columns for end in ("min", "max")]
    files = []
    for row in actions.select(wanted).to_pylist():
        bounds = {n: (row[f"min.{n}"], row[f"max.{n}"]) for n in columns
                  if row[f"min.{n}"] is not None and row[f"max.{n}"] is not None}
        files.append(DataFile(row["path"], row["size_bytes"], bounds))
    return files


@dataclass
class Snapshot:
    """What a small commit needs to know of the table at `version`."""

    version: int
    schema: pa.Schema
    fits: bool
    """The protocol and metadata allow small commits."""
    cdf: bool
    checkpoint_interval: int
    files: list[DataFile]
    transactions: dict[str, int | None] = field(default_factory=dict)
    merge_on_read: bool = False
    """Changed rows are marked deleted in their files (deletion vectors), not rewritten."""

    @classmethod
    def of(cls, handle: DeltaTable, root: str) -> Snapshot:
        """The snapshot of a delta-rs handle at its version (the table at local path `root`)."""
        schema = pa.schema(handle.schema().to_arrow())
        configuration = handle.metadata().configuration
        fits = _protocol_fits(handle) and _metadata_fits(handle, schema)
        files: list[DataFile] | None = _data_files(pa.table(handle.get_add_actions(flatten=True)))
        if fits and files and may_hold_deletion_vectors(handle):
            files = _with_vectors(files, root, handle.version())
            fits = files is not None
        return cls(handle.version(), schema, fits, _cdf_enabled(handle),
                   int(configuration.get("delta.checkpointInterval", "100")), files or [],
                   merge_on_read=fits and _writes_vectors(handle))


def _with_vectors(files: list[DataFile], root: str, version: int) -> list[DataFile] | None:
    """`files` with their deletion vectors, statistics and times from the log (None: the log read here does
    not list the same files as delta-rs, so no small commit is made on it)."""
    try:
        logged = live_files(root, version)
    except (OSError, ValueError, KeyError, pa.ArrowException):
        return None
    if {unquote(file.path) for file in files} != set(logged):
        return None
    out = []
    for file in files:
        entry = logged[unquote(file.path)]
        out.append(DataFile(file.path, file.size, file.bounds, entry.deletion_vector, entry.stats,
                            entry.modification_time))
    return out


class SmallCommits:
    """Small commits to the table at local path `root`, and the snapshot they keep between batches."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.snapshot: Snapshot | None = None
        self.checkpoint_due = False
        """The last commit reached the table's checkpoint interval: the caller writes the checkpoint."""

    @classmethod
    def of(cls, uri: str) -> SmallCommits | None:
        """For a table on a local filesystem; None elsewhere (no create-if-absent for the log there)."""
        root = local_root(uri)
        return None if root is None else cls(root)

    def _log(self, version: int) -> str:
        return os.path.join(self.root, "_delta_log", f"{version:020d}.json")

    def current(self) -> Snapshot | None:
        """The kept snapshot when the log has no entry after it; None when it must be loaded."""
        snapshot = self.snapshot
        if snapshot is None or os.path.exists(self._log(snapshot.version + 1)) or not os.path.exists(
                self._log(snapshot.version)):
            self.snapshot = None
            return None
        return snapshot

    def load(self, handle: DeltaTable) -> Snapshot:
        """Take the snapshot of `handle` (just refreshed)."""
        self.snapshot = Snapshot.of(handle, self.root)
        return self.snapshot

    def commit(self, changes: pa.Table, primary_key: tuple[str, ...], app_id: str, batch_id: int) -> bool:
        """Commit `changes` (`merge_plan`'s batch: data columns, `_cdc_delete`, keep flags) as the MERGE
        would, on the current snapshot; False when there is none, the batch does not fit, or another
        writer took the next version first (nothing was committed: the caller MERGEs)."""
        snapshot = self.current()
        if snapshot is None or not snapshot.fits or changes.num_rows == 0:
            return False
        schema = snapshot.schema
        data = [n for n in changes.column_names if n != DELETE_FLAG and not n.startswith(KEEP_FLAG_PREFIX)]
        if any(name not in schema.names for name in data):
            return False
        kept = {n[len(KEEP_FLAG_PREFIX):]: n for n in changes.column_names if n.startswith(KEEP_FLAG_PREFIX)}
        typed = _typed_changes(changes, schema, data)
        if typed is None or not _unique_keys(typed, primary_key):
            return False
        files = _candidates(snapshot.files, typed, primary_key)
        if sum(file.size for file in files) > (MAX_READ_BYTES if snapshot.merge_on_read else MAX_REWRITE_BYTES):
            return False
        try:
            if snapshot.merge_on_read:
                stored, counts, earlier = _matched(self.root, files, schema, typed, primary_key)
            else:
                stored, counts = _read(self.root, files, schema)
        except (OSError, ValueError, pa.ArrowException):  # a file it cannot read here (a path outside the table...)
            self.snapshot = None
            return False
        changed = _changed_rows(stored, typed, data, kept, schema, primary_key, not snapshot.merge_on_read)
        rewritten, feed, touched = changed.rows, changed.feed, changed.touched
        marked: dict[int, np.ndarray] = {}
        if snapshot.merge_on_read:
            marked = _marked(earlier, counts, changed.gone)
            folded = {index: marked.pop(index) for index in list(marked) if (counts[index] - len(marked[index])) * 2
                      < counts[index]}
            if folded:
                rewritten = pa.concat_tables([rewritten, _rest(self.root, files, schema, folded)])
        if any(not f.nullable and rewritten.column(f.name).null_count for f in schema):
            return False
        if feed.num_rows == 0:  # only deletes of absent keys: the MERGE commits an empty change
            return False
        now = int(time.time() * 1000)
        actions: list[dict] = [
            {"commitInfo": {"timestamp": now, "operation": "MERGE", "readVersion": snapshot.version,
                            "operationParameters": {"mergePredicate": " AND ".join(primary_key)},
                            "engineInfo": _ENGINE, "clientVersion": _ENGINE,
                            "operationMetrics": {"num_source_rows": changes.num_rows,
                                                 "num_target_files_removed": len(touched)}}},
            {"txn": {"appId": app_id, "version": int(batch_id), "lastUpdated": now}},
        ]
        added = None
        written = []
        if rewritten.num_rows:
            path, size = _write(self.root, "", rewritten)
            added = DataFile(path, size, _key_bounds(rewritten, primary_key), stats=_stats(rewritten), modified=now)
            written.append(path)
            actions.append({"add": _add_action(added)})
        if snapshot.cdf:
            path, size = _write(self.root, "_change_data", feed)
            written.append(path)
            actions.append({"cdc": {"path": path, "partitionValues": {}, "size": size, "dataChange": False}})
        if marked:
            name, vectors = write_vectors(self.root, list(marked.values()))
            written.append(name)
            descriptors = dict(zip(marked, vectors))
        removed, replaced = set(), {}
        for index in sorted(touched):
            file = files[index]
            remove = {"path": file.path, "dataChange": True, "deletionTimestamp": now, "extendedFileMetadata": True,
                      "partitionValues": {}, "size": file.size}
            if file.vector is not None:
                remove["deletionVector"] = file.vector.action()
            actions.append({"remove": remove})
            if index in marked:
                replaced[file.path] = DataFile(file.path, file.size, file.bounds, descriptors[index],
                                               _loose(file.stats), file.modified)
                actions.append({"add": _add_action(replaced[file.path])})
            else:
                removed.add(file.path)
        if not _create_if_absent(self.root, snapshot.version + 1, _entry(actions)):
            self.snapshot = None
            for path in written:  # no log entry names them
                os.remove(os.path.join(self.root, path))
            return False
        self._advance(snapshot, removed, replaced, added, rewritten, primary_key, app_id, batch_id)
        return True

    def _advance(self, snapshot: Snapshot, removed: set[str], replaced: dict[str, DataFile],
                 added: DataFile | None, rows: pa.Table, primary_key: tuple[str, ...], app_id: str,
                 batch_id: int) -> None:
        """The snapshot after this module's commit: files, kept rows, the transaction, the version."""
        files = [replaced.get(file.path, file) for file in snapshot.files if file.path not in removed]
        for path in removed:
            _KEPT.drop(self.root, path)
        if added is not None:
            files.append(added)
            _KEPT.put(self.root, added.path, rows)
        snapshot.files = files
        snapshot.transactions[app_id] = int(batch_id)
        snapshot.version += 1
        self.checkpoint_due = snapshot.version % snapshot.checkpoint_interval == 0
