"""A small MERGE as one commit computed in Arrow: the fast path of `DeltaRsTable.merge`.

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

On a table with deletion vectors enabled the commit is merge-on-read (docs/design/merge-on-read.md):
only the key columns of the files a batch may touch are read, then the rows found; the changed rows
are marked deleted in their files (a new deletion vector per touched file) instead of rewritten, and
the new data file holds the batch's rows, plus the rest of any touched file most of whose rows are then
gone. The files' existing vectors and statistics come from the log (`log_replay`).

The MERGE stays the reference: `tests/integration/connectors/delta/test_small_commit.py` and
`test_merge_on_read.py` hold the two equal (table, change feed, transactions) over generated batches,
and read a small commit back with delta-spark.

A batch fits when:
- the table lives on a local filesystem (an object store has no create-if-absent here);
- the table is unpartitioned, its protocol is reader 1 / writer <= 4, or reader 3 / writer 7 with no
  features but the change feed, deletion vectors, appendOnly, invariants (and a variantType no column
  uses), it is not append-only, and has no constraints, invariants or generated columns; on a table
  with deletion vectors, the log lists the files delta-rs does;
- the batch brings no new column, its values convert to the table's types, and no key twice;
- the files it may touch hold at most `MAX_REWRITE_BYTES`, or their rows are all kept in memory
  (`MAX_READ_BYTES` marking rows).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from connectors.delta.data_file_rows import (
    FILE,
    KEPT,
    POSITION,
    DataFile,
    candidates,
    matched_rows,
    read_rows,
    remaining_rows,
)
from connectors.delta.deletion_vectors import write_vectors
from connectors.delta.log_replay import live_files
from connectors.delta.merge_plan import DELETE_FLAG, KEEP_FLAG_PREFIX
from connectors.delta.table_scan import may_hold_deletion_vectors

__all__ = ["MAX_READ_BYTES", "MAX_REWRITE_BYTES", "DataFile", "SmallCommits", "Snapshot", "local_root"]

MAX_REWRITE_BYTES = 16 * 1024 * 1024
"""Above this many bytes of data files to rewrite, the commit's own cost no longer dominates: MERGE, unless
every one of them is kept in memory (`KEPT`, `_affordable`)."""
MAX_READ_BYTES = 256 * 1024 * 1024
"""Marking rows deleted (deletion vectors) rewrites nothing, but the files a batch may touch are still read
whole (the stored rows of updated keys): above this many bytes of them, MERGE."""
_CHANGE_TYPE = "_change_type"
_ROW = "__small_commit_row"
_CHANGE = "__small_commit_change"
_STATS_TYPES = (pa.types.is_integer, pa.types.is_date32, pa.types.is_string, pa.types.is_large_string)
_STRING_STATS_CHARS = 32
_WRITER_FEATURES = {"changeDataFeed", "deletionVectors", "appendOnly", "invariants"}
"""Writer features a small commit honours: the change feed, deletion vectors, and two whose use the
metadata check refuses (`delta.appendOnly`, invariants)."""
_READER_FEATURES = {"deletionVectors"}
_VARIANT = "variantType"
"""Listed by delta-rs on every table it creates at reader version 3; fine while no column is a variant."""
_ENGINE = "cdc-lakehouse small commit"
_WRITERS = ThreadPoolExecutor(2, thread_name_prefix="small-commit-write")


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


def _affordable(root: str, files: list[DataFile], merge_on_read: bool) -> bool:
    """Whether the small commit takes a batch touching `files`: marking rows deleted, up to `MAX_READ_BYTES`
    of them; rewriting them, up to `MAX_REWRITE_BYTES`, or any size when the rows of all of them are kept in
    memory (the files the small commits wrote last, `KEPT_ROWS_BYTES` in all). Those it reads nowhere, where
    the MERGE reads and joins them: a steady batch of 55,794 net changes of the realistic capture rewriting
    its 52 MB file committed in 0.24-0.26 s against the MERGE's 0.45 s (docs/design/merge-on-read.md); read
    back from their files, the two cost about the same."""
    size = sum(file.size for file in files)
    if merge_on_read:
        return size <= MAX_READ_BYTES
    return size <= MAX_REWRITE_BYTES or all(KEPT.get(root, file.path) is not None for file in files)


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


def _either(flag: pa.ChunkedArray, kept: pa.ChunkedArray, values: pa.ChunkedArray) -> pa.ChunkedArray:
    """`if_else(flag, kept, values)`, without a copy where `flag` is all true or all false (a TOAST column
    every update of the batch leaves unchanged)."""
    chosen = pc.sum(flag).as_py() or 0
    if chosen == len(flag):
        return kept
    if chosen == 0:
        return values
    return pc.if_else(flag, kept, values)


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
    """The batch applied to the rows of the files it may touch (`read_rows`); with `rewrite`, the touched
    files' rows the batch leaves alone go to the new data file too (copy-on-write)."""
    change_index, row_index = _matches(stored, changes, primary_key)
    deleted = pc.fill_null(changes.column(DELETE_FLAG), False).to_numpy(zero_copy_only=False).astype(bool)
    matched_deleted = deleted[change_index]
    upd_change, upd_row = change_index[~matched_deleted], row_index[~matched_deleted]
    file_of = stored.column(FILE).to_numpy()
    touched = np.unique(file_of[row_index])
    plain = stored.drop_columns([FILE, POSITION])

    before = plain.take(upd_row)
    every_change = len(upd_change) == changes.num_rows and bool(np.all(upd_change == np.arange(len(upd_change))))
    after_columns = []
    for field in schema:
        if field.name in data:
            values = changes.column(field.name)
            values = values if every_change else values.take(upd_change)
            if field.name in kept:
                flag = pc.fill_null(changes.column(kept[field.name]), False)
                values = _either(flag if every_change else flag.take(upd_change), before.column(field.name), values)
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
    gone_positions = stored.column(POSITION).to_numpy()[row_index]
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
        files = candidates(snapshot.files, typed, primary_key)
        if not _affordable(self.root, files, snapshot.merge_on_read):
            return False
        try:
            if snapshot.merge_on_read:
                stored, counts, earlier = matched_rows(self.root, files, schema, typed, primary_key)
            else:
                stored, counts = read_rows(self.root, files, schema)
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
                rewritten = pa.concat_tables([rewritten, remaining_rows(self.root, files, schema, folded)])
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
        # The data file and the change-data file are written side by side (Arrow's writer releases the GIL).
        data_file = _WRITERS.submit(_write, self.root, "", rewritten) if rewritten.num_rows else None
        change_file = _WRITERS.submit(_write, self.root, "_change_data", feed) if snapshot.cdf else None
        if data_file is not None:
            path, size = data_file.result()
            added = DataFile(path, size, _key_bounds(rewritten, primary_key), stats=_stats(rewritten), modified=now)
            written.append(path)
            actions.append({"add": _add_action(added)})
        if change_file is not None:
            path, size = change_file.result()
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
            KEPT.drop(self.root, path)
        if added is not None:
            files.append(added)
            KEPT.put(self.root, added.path, rows)
        snapshot.files = files
        snapshot.transactions[app_id] = int(batch_id)
        snapshot.version += 1
        self.checkpoint_due = snapshot.version % snapshot.checkpoint_interval == 0
