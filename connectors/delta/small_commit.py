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

The MERGE stays the reference: `tests/unit/test_small_commit.py` holds the two equal (table,
change feed, transactions) over generated batches, and reads a small commit back with delta-spark.

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
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from connectors.delta.merge_plan import DELETE_FLAG, KEEP_FLAG_PREFIX

__all__ = ["MAX_REWRITE_BYTES", "small_commit"]

MAX_REWRITE_BYTES = 16 * 1024 * 1024
"""Above this many bytes of data files to rewrite, the commit's own cost no longer dominates: MERGE."""
_CHANGE_TYPE = "_change_type"
_ROW = "__small_commit_row"
_CHANGE = "__small_commit_change"
_STATS_TYPES = (pa.types.is_integer, pa.types.is_date32, pa.types.is_string, pa.types.is_large_string)
_STRING_STATS_CHARS = 32
_FEATURES = {"changeDataFeed"}
_ENGINE = "cdc-lakehouse small commit"


def _local_root(uri: str) -> str | None:
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return unquote(parsed.path) if parsed.scheme else uri
    return None


def _protocol_fits(handle: DeltaTable) -> bool:
    protocol = handle.protocol()
    if protocol.min_reader_version > 1 or protocol.reader_features:
        return False
    if protocol.min_writer_version == 7:
        return set(protocol.writer_features or ()) <= _FEATURES
    return protocol.min_writer_version <= 4


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


def _candidates(handle: DeltaTable, changes: pa.Table, primary_key: tuple[str, ...]) -> pa.Table:
    """The table's files whose key statistics do not rule out every key of the batch."""
    files = pa.table(handle.get_add_actions(flatten=True))
    if files.num_rows == 0:
        return files
    keep = pa.array([True] * files.num_rows)
    for name in primary_key:
        low, high = f"min.{name}", f"max.{name}"
        if low not in files.column_names or high not in files.column_names:
            continue
        bounds = pc.min_max(changes.column(name))
        below = pc.less(files.column(high), bounds["min"])
        above = pc.greater(files.column(low), bounds["max"])
        ruled_out = pc.fill_null(pc.or_(below, above), False)
        keep = pc.and_(keep, pc.invert(ruled_out))
    return files.filter(keep)


def _read(root: str, files: pa.Table, schema: pa.Schema) -> pa.Table:
    """The rows of `files` in the table's schema, each with its file's index (column `__file`)."""
    parts = []
    for index, path in enumerate(files.column("path").to_pylist()):
        rows = pq.read_table(os.path.join(root, unquote(path)), schema=schema)
        parts.append(rows.append_column("__file", pa.array([index] * rows.num_rows, pa.int32())))
    if not parts:
        return schema.empty_table().append_column("__file", pa.array([], pa.int32()))
    return pa.concat_tables(parts)


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


def _changed_rows(stored: pa.Table, changes: pa.Table, data: list[str], kept: dict[str, str],
                  schema: pa.Schema, primary_key: tuple[str, ...]) -> tuple[pa.Table, pa.Table, set[int]]:
    """(the new data file's rows: the touched files' other rows, the updated and the inserted rows;
    the change-data rows; the indexes of the touched files, those holding a key of the batch)."""
    numbered = stored.append_column(_ROW, pa.array(range(stored.num_rows), pa.int64()))
    incoming = changes.append_column(_CHANGE, pa.array(range(changes.num_rows), pa.int64()))
    pairs = incoming.select(list(primary_key) + [_CHANGE]).join(
        numbered.select(list(primary_key) + [_ROW]), keys=list(primary_key), join_type="inner")
    change_index, row_index = pairs.column(_CHANGE).combine_chunks(), pairs.column(_ROW).combine_chunks()
    deleted = pc.fill_null(changes.column(DELETE_FLAG), False).combine_chunks()
    matched_deleted = pc.take(deleted, change_index)
    upd_change = pc.filter(change_index, pc.invert(matched_deleted))
    upd_row = pc.filter(row_index, pc.invert(matched_deleted))
    del_row = pc.filter(row_index, matched_deleted)
    files = pc.unique(pc.take(stored.column("__file"), row_index)).to_pylist()
    plain = stored.drop_columns(["__file"])

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

    matched = pc.is_in(pa.array(range(changes.num_rows), pa.int64()), value_set=change_index)
    new = pc.and_(pc.invert(matched), pc.invert(deleted))
    inserted_columns = []
    fresh = changes.filter(new)
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

    in_touched = pc.is_in(stored.column("__file"), value_set=pa.array(files, pa.int32()))
    untouched = pc.and_(in_touched, pc.invert(pc.is_in(numbered.column(_ROW), value_set=row_index)))
    rewritten = pa.concat_tables([plain.filter(untouched), after, inserted])

    def typed(rows: pa.Table, kind: str) -> pa.Table:
        return rows.append_column(_CHANGE_TYPE, pa.array([kind] * rows.num_rows, pa.string()))

    feed = pa.concat_tables([typed(plain.take(del_row), "delete"), typed(before, "update_preimage"),
                             typed(after, "update_postimage"), typed(inserted, "insert")])
    return rewritten, feed, set(files)


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


def small_commit(handle: DeltaTable, uri: str, changes: pa.Table, primary_key: tuple[str, ...],
                 app_id: str, batch_id: int) -> bool:
    """Commit `changes` (`merge_plan`'s batch: data columns, `_cdc_delete`, keep flags) to the table
    `handle` reads at its current version, as the MERGE would; False when the batch does not fit or
    another writer took the next version first (nothing was committed: the caller MERGEs)."""
    root = _local_root(uri)
    if root is None or changes.num_rows == 0 or not _protocol_fits(handle):
        return False
    schema = pa.schema(handle.schema().to_arrow())
    if not _metadata_fits(handle, schema):
        return False
    data = [n for n in changes.column_names if n != DELETE_FLAG and not n.startswith(KEEP_FLAG_PREFIX)]
    if any(name not in schema.names for name in data):
        return False
    kept = {n[len(KEEP_FLAG_PREFIX):]: n for n in changes.column_names if n.startswith(KEEP_FLAG_PREFIX)}
    typed = _typed_changes(changes, schema, data)
    if typed is None or not _unique_keys(typed, primary_key):
        return False
    files = _candidates(handle, typed, primary_key)
    if files.num_rows and pc.sum(files.column("size_bytes")).as_py() > MAX_REWRITE_BYTES:
        return False
    stored = _read(root, files, schema)
    rewritten, feed, touched = _changed_rows(stored, typed, data, kept, schema, primary_key)
    if any(not f.nullable and rewritten.column(f.name).null_count for f in schema):
        return False
    if feed.num_rows == 0:  # only deletes of absent keys: the MERGE commits an empty change
        return False
    now = int(time.time() * 1000)
    version = handle.version()
    actions: list[dict] = [
        {"commitInfo": {"timestamp": now, "operation": "MERGE", "readVersion": version,
                        "operationParameters": {"mergePredicate": " AND ".join(primary_key)},
                        "engineInfo": _ENGINE, "clientVersion": _ENGINE,
                        "operationMetrics": {"num_source_rows": changes.num_rows,
                                             "num_target_files_removed": len(touched)}}},
        {"txn": {"appId": app_id, "version": int(batch_id), "lastUpdated": now}},
    ]
    if rewritten.num_rows:
        path, size = _write(root, "", rewritten)
        actions.append({"add": {"path": path, "partitionValues": {}, "size": size, "modificationTime": now,
                                "dataChange": True, "stats": _stats(rewritten)}})
    if _cdf_enabled(handle):
        path, size = _write(root, "_change_data", feed)
        actions.append({"cdc": {"path": path, "partitionValues": {}, "size": size, "dataChange": False}})
    paths, sizes = files.column("path").to_pylist(), files.column("size_bytes").to_pylist()
    for index in sorted(touched):
        actions.append({"remove": {"path": paths[index], "dataChange": True, "deletionTimestamp": now,
                                   "extendedFileMetadata": True, "partitionValues": {}, "size": sizes[index]}})
    if not _create_if_absent(root, version + 1, _entry(actions)):
        return False
    interval = int(handle.metadata().configuration.get("delta.checkpointInterval", "100"))
    if (version + 1) % interval == 0:
        handle.update_incremental()
        handle.create_checkpoint()
    return True
