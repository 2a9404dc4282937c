"""Turn a batch of net changes into a typed Arrow table and MERGE it into Delta, once.

Commit order, enforced here: the Delta commit (data + application transaction with the
batch id) happens inside the batch; Spark records the batch's offsets as done only after
this returns. A crash in between replays the batch, which `apply` then skips.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from connectors.delta.arrow_types import infer_types, merge_types, rows_to_table
from connectors.delta.delta_rs import DELETE_FLAG, DeltaSchemaError
from connectors.delta.engines import DeltaEngineTable
from connectors.delta.merge_plan import keep_flag
from service.config.choices import SchemaChanges
from service.config.table_shape import TableShape
from service.kafka_to_delta.materialize.fill_unchanged import filled_net
from service.kafka_to_delta.rows.names import Meta
from service.kafka_to_delta.sink.row_shape import delete_times, shaped, with_soft_delete_columns
from service.kafka_to_delta.sink.schema_changes import conform
from vocabulary.changes import ChangeKind

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MergeOutcome:
    """What one batch did to the table."""

    batch_id: int
    upserts: int
    deletes: int
    skipped_replay: bool = False
    truncated: bool = False


def _batch_types(net: pa.Table, rows: list[dict]) -> dict[str, str]:
    """Column types: the schema blocks' types win; the data only types columns they lack."""
    types: dict[str, str] = {}
    for text in pc.unique(net.column("types").drop_null()).to_pylist():
        types = merge_types(types, json.loads(text))
    inferred = infer_types(rows) if rows else {}
    return {**types, **{column: kind for column, kind in inferred.items() if column not in types}}


def _with_keep_flags(batch: pa.Table, unchanged: pa.ChunkedArray | pa.Array, primary_key: tuple[str, ...],
                     only_batch_columns: bool = False) -> pa.Table:
    """One `_cdc_keep__<column>` flag per column some row left unchanged (a TOAST placeholder);
    `unchanged`: per row, the JSON list of such columns or null; `only_batch_columns`: no flag for a
    column the batch lacks (`schema_changes: ignore` dropped it)."""
    if unchanged.null_count == len(unchanged):
        return batch
    # A batch holds few distinct lists (a table's TOASTed columns): each parsed once, each flag one `is_in`.
    lists = {text: set(json.loads(text)) for text in pc.unique(unchanged).to_pylist() if text}
    columns = sorted(set().union(*lists.values()) - set(primary_key))
    if only_batch_columns:
        columns = [column for column in columns if column in batch.column_names]
    for column in columns:
        if column not in batch.column_names:
            batch = batch.append_column(column, pa.nulls(batch.num_rows, pa.string()))
        naming = pa.array([text for text, names in lists.items() if column in names], pa.string())
        batch = batch.append_column(keep_flag(column), pc.fill_null(pc.is_in(unchanged, value_set=naming), False))
    return batch


class MergeSink:
    """Writes net changes of one pipeline into one Delta table, idempotently per batch; a source schema
    change is handled per `schema_changes` (`sink.schema_changes`); deletes, nulls and the new table's
    layout per `shape` (`sink.row_shape`)."""

    def __init__(self, table: DeltaEngineTable, primary_key: tuple[str, ...],
                 schema_changes: SchemaChanges = "lenient", one_commit_create: bool = False,
                 shape: TableShape | None = None) -> None:
        """`one_commit_create`: a new table is created holding its first batch in one commit (no empty
        first version); a database source's tables are, a pipeline's table keeps its empty version 0."""
        self.table = table
        self.primary_key = primary_key
        self.schema_changes = schema_changes
        self.one_commit_create = one_commit_create
        self.shape = shape or TableShape()
        self._properties_checked = False

    def _check_properties(self) -> None:
        """An existing table has the properties the shape creates a table with (deletion vectors), or the
        pipeline stops saying how to enable them: they are never turned on silently (readers must know them)."""
        stored = self.table.configuration()
        missing = {k: v for k, v in self.shape.table_properties().items() if stored.get(k, "").lower() != v}
        if missing:
            settings = ", ".join(f"'{key}' = {value}" for key, value in missing.items())
            raise DeltaSchemaError(
                f"table {self.table.uri}: table_shape.deletion_vectors is set but the table was created without "
                f"them; enable them with ALTER TABLE ... SET TBLPROPERTIES ({settings}) (every reader of the table "
                "must then know deletion vectors), or leave the option out")
        self._properties_checked = True

    def already_committed(self, app_id: str, batch_id: int) -> bool:
        """True when this batch's commit is already in the table (a replay)."""
        last = self.table.last_batch(app_id)
        return last is not None and last >= batch_id

    def apply(self, net: pa.Table, app_id: str, batch_id: int, truncate: bool = False) -> MergeOutcome:
        """MERGE the net changes (columns key, kind, row, types) unless already committed.

        `truncate`: every stored row the batch does not upsert is deleted in the same commit
        (a source TRUNCATE followed by the batch's later changes).
        """
        if self.already_committed(app_id, batch_id):
            return MergeOutcome(batch_id, 0, 0, skipped_replay=True)
        net = filled_net(net)
        if net.num_rows == 0:
            return self._merge_nothing(batch_id, app_id, truncate)
        deletes = pc.equal(net.column("kind"), ChangeKind.DELETE.value)
        rows = [
            dict(zip(self.primary_key, json.loads(key))) if deleted or text is None else json.loads(text)
            for key, text, deleted in zip(
                net.column("key").to_pylist(), net.column("row").to_pylist(), deletes.to_pylist()
            )
        ]
        upsert_rows = [r for r, d in zip(rows, deletes.to_pylist()) if not d]
        types = _batch_types(net, upsert_rows or rows)
        unchanged = net.column("unchanged") if "unchanged" in net.column_names else pa.nulls(net.num_rows, pa.string())
        return self._merge(rows_to_table(rows, types), deletes, unchanged, app_id, batch_id, truncate)

    def apply_typed(self, changes: pa.Table, app_id: str, batch_id: int, truncate: bool = False) -> MergeOutcome:
        """MERGE typed net changes (`batch_changes.BatchChanges.changes`) unless already committed."""
        if self.already_committed(app_id, batch_id):
            return MergeOutcome(batch_id, 0, 0, skipped_replay=True)
        if changes.num_rows == 0:
            return self._merge_nothing(batch_id, app_id, truncate)
        deletes = pc.equal(changes.column(Meta.KIND), ChangeKind.DELETE.value)
        data = changes.drop_columns(list(Meta.ALL))
        return self._merge(data, deletes, changes.column(Meta.UNCHANGED), app_id, batch_id, truncate,
                           changes.select(list(Meta.ALL)), changes.column(Meta.TIMESTAMP))

    def _merge_nothing(self, batch_id: int, app_id: str, truncate: bool) -> MergeOutcome:
        if truncate and self.table.schema() is not None:
            self.table.truncate(app_id, batch_id)
        return MergeOutcome(batch_id, 0, 0, truncated=truncate)

    def _merge(self, data: pa.Table, deletes: pa.ChunkedArray | pa.Array, unchanged: pa.ChunkedArray | pa.Array,
               app_id: str, batch_id: int, truncate: bool, meta: pa.Table | None = None,
               timestamps: pa.ChunkedArray | None = None) -> MergeOutcome:
        """MERGE typed rows; `deletes` flags the rows that delete their key; `timestamps`: the changes'
        Kafka timestamps (ms), a soft delete's time (none: now)."""
        missing = [c for c in self.primary_key if c not in data.column_names]
        if missing:
            raise DeltaSchemaError(f"{self.table.uri}: primary key column(s) {missing} not in the data")
        if self.shape.soft_deletes:
            data = with_soft_delete_columns(data, deletes, delete_times(timestamps, data.num_rows))
        existing = self.table.schema()
        if existing is not None and not self._properties_checked:
            self._check_properties()
        conformed = conform(data, existing, self.table.uri, self.schema_changes, meta)
        typed = conformed.batch
        if existing is None and not self.one_commit_create:
            problem = self.shape.layout_problem(typed.schema.names)
            if problem is not None:
                raise DeltaSchemaError(f"table {self.table.uri}: {problem}")
            self.table.create(typed.schema, self.shape.partition_by, self.shape.cluster_by)
        elif conformed.widen:
            log.info("table %s: widening %s (schema_changes: %s)", self.table.uri,
                     {name: str(kind) for name, kind in conformed.widen.items()}, self.schema_changes)
            self.table.widen(conformed.widen, app_id, batch_id)
        typed = _with_keep_flags(typed.append_column(DELETE_FLAG, deletes), unchanged, self.primary_key,
                                 only_batch_columns=existing is not None and self.schema_changes == "ignore")
        typed = shaped(typed, self.primary_key, self.shape)
        if existing is None and self.one_commit_create:  # a truncate of a new table deletes nothing
            self.table.create_with(typed, self.primary_key, app_id, batch_id)
        elif truncate:
            self.table.merge(typed, self.primary_key, app_id, batch_id, truncate=True)
        else:
            self.table.merge(typed, self.primary_key, app_id, batch_id)
        n_deletes = pc.sum(deletes).as_py() or 0
        return MergeOutcome(batch_id, data.num_rows - n_deletes, n_deletes, truncated=truncate)
