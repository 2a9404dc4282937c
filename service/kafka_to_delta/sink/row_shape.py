"""A batch of typed net changes shaped by the pipeline's `table_shape` before its MERGE
(service/config/table_shape.py): soft deletes.

They ride on the MERGE's keep flags (`merge_plan.keep_flag`), the mechanism that keeps a stored
value under Debezium's unavailable-value placeholder: a flagged column keeps the stored value on an
update and is NULL on an insert.

- Soft deletes: every row gets `__DELETED` and `__DELETED_AT` (the delete's time, null for an upsert);
  a delete becomes an upsert of the key that keeps every other stored column. A delete of a key the
  table lacks inserts the key alone, flagged deleted; a later upsert of the key sets `__DELETED` false.
- ignore_null_updates is not applied here: the decode made each null of an update an unchanged
  marker like the placeholder (`changelog.from_changelog`, `source.debezium_columns`), filled from the
  key's earlier images of the batch; what is left of them arrives as keep flags. A null without a flag
  (an insert's) is stored, also by a re-insert of a soft-deleted key.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from connectors.delta.merge_plan import DELETE_FLAG, keep_flag
from service.config.table_shape import DELETED, DELETED_AT, SOFT_DELETE_COLUMNS, TableShape

DELETED_AT_TYPE = pa.timestamp("us", tz="UTC")


def delete_times(timestamps_ms: pa.ChunkedArray | pa.Array | None, rows: int) -> pa.Array:
    """The changes' times as `DELETED_AT_TYPE` from Kafka record timestamps (ms); none given: now."""
    if timestamps_ms is None:
        now = datetime.now(timezone.utc)
        return pa.array([now] * rows, DELETED_AT_TYPE)
    values = pc.multiply(pc.cast(timestamps_ms, pa.int64()), 1000)
    return pc.cast(values, pa.timestamp("us")).cast(DELETED_AT_TYPE)


def with_soft_delete_columns(data: pa.Table, deletes: pa.ChunkedArray | pa.Array,
                             times: pa.ChunkedArray | pa.Array) -> pa.Table:
    """`data` with `__DELETED` (the row deletes its key) and `__DELETED_AT` (its time; null for an upsert)."""
    flags = pc.fill_null(deletes, False)
    if isinstance(flags, pa.ChunkedArray):
        flags = flags.combine_chunks()
    deleted_at = pc.if_else(flags, times, pa.nulls(len(flags), DELETED_AT_TYPE))
    data = data.drop_columns([c for c in SOFT_DELETE_COLUMNS if c in data.column_names])
    return data.append_column(pa.field(DELETED, pa.bool_()), flags).append_column(
        pa.field(DELETED_AT, DELETED_AT_TYPE), deleted_at)


def _or_keep_flag(batch: pa.Table, column: str, mask: pa.ChunkedArray | pa.Array) -> pa.Table:
    """`batch` whose keep flag of `column` is also set where `mask` is."""
    name = keep_flag(column)
    if name not in batch.column_names:
        return batch.append_column(pa.field(name, pa.bool_()), pc.fill_null(mask, False))
    index = batch.schema.get_field_index(name)
    merged = pc.or_(pc.fill_null(batch.column(name), False), pc.fill_null(mask, False))
    return batch.set_column(index, pa.field(name, pa.bool_()), merged)


def shaped(batch: pa.Table, primary_key: tuple[str, ...], shape: TableShape) -> pa.Table:
    """The MERGE input `batch` (data columns, `DELETE_FLAG`, keep flags) shaped by `shape`."""
    if not shape.soft_deletes:
        return batch
    deletes = pc.fill_null(batch.column(DELETE_FLAG), False)
    own = set(primary_key) | set(SOFT_DELETE_COLUMNS) | {DELETE_FLAG}
    data = [c for c in batch.column_names if c not in own and not c.startswith(keep_flag(""))]
    for column in data:
        batch = _or_keep_flag(batch, column, deletes)
    index = batch.schema.get_field_index(DELETE_FLAG)
    return batch.set_column(index, batch.schema.field(DELETE_FLAG), pa.array([False] * batch.num_rows))
