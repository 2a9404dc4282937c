"""Writes a pipeline's SCD type 2 history table (`history:`), one commit per micro-batch, idempotently.

Per batch: every change of the batch (not only the net change per key), typed where its Kafka range
was read (`source.history_rows`), becomes an event with its sequence value; the stored history rows of
the touched keys are read back; the keys' histories are recomputed in Arrow (`history_versions`); and
the difference is MERGEd on (key, `__START_AT`) under the application transaction (app id, batch id),
so a replayed batch is skipped and a batch whose changes the history already holds commits nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.delta.delta_rs import DELETE_FLAG, DeltaSchemaError
from connectors.delta.engines import DeltaEngineTable
from service.config.choices import SchemaChanges
from service.config.history import DELETED, END_AT, START_AT, UPDATED_AT, HistorySettings
from service.kafka_to_delta.materialize.payload import HISTORY_META
from service.kafka_to_delta.materialize.payload import HISTORY_SEQUENCE as SEQUENCE
from service.kafka_to_delta.rows.names import Meta
from service.kafka_to_delta.sink.history_versions import (
    IS_DELETE,
    ORDER,
    UNCHANGED,
    changed_rows,
    recompute,
    stored_events,
)
from service.kafka_to_delta.sink.schema_changes import conform
from vocabulary.changes import ChangeKind
from vocabulary.errors import SourceCoordinates

log = logging.getLogger(__name__)
_ORDER = (Meta.TOPIC, Meta.PARTITION, Meta.OFFSET, Meta.CHANGE_INDEX)


@dataclass(frozen=True)
class HistoryOutcome:
    """What one batch did to the history table."""

    batch_id: int
    keys: int
    written: int  # rows inserted or replaced
    removed: int
    skipped_replay: bool = False


def _row_changes(rows: pa.Table) -> pa.Table:
    """The batch's row changes without a -U its +U follows (an update's before image): of each key's
    changes in source order."""
    order = pc.sort_indices(rows.select([Meta.KEY, *_ORDER]), [(c, "ascending") for c in (Meta.KEY, *_ORDER)])
    kinds = rows.column(Meta.KIND).take(order).to_numpy(zero_copy_only=False)
    keys = rows.column(Meta.KEY).take(order).to_numpy(zero_copy_only=False)
    before = kinds == ChangeKind.UPDATE_BEFORE.value
    followed = np.zeros(len(kinds), dtype=bool)
    followed[:-1] = (kinds[1:] == ChangeKind.UPDATE_AFTER.value) & (keys[1:] == keys[:-1])
    kept = np.ones(len(kinds), dtype=bool)
    kept[order.to_numpy()[before & followed]] = False
    return rows.filter(pa.array(kept))


def _sequence(rows: pa.Table, table: str) -> pa.ChunkedArray:
    """The changes' sequence values; a change without one is an error naming it."""
    values = rows.column(SEQUENCE)
    if values.null_count:
        missing = pc.index(pc.is_null(values), True).as_py()
        at = rows.slice(missing, 1).select([Meta.TOPIC, Meta.PARTITION, Meta.OFFSET, Meta.KEY]).to_pylist()[0]
        where = SourceCoordinates(*at.values())
        raise DeltaSchemaError(f"history table {table}: a change has no sequence value for __START_AT "
                               f"({where}); set history.sequence_by to a value every change carries")
    return values


def batch_events(history: pa.Table, table: str) -> pa.Table:
    """The events of a batch's row changes (`BatchChanges.history`): the typed row (a delete's key),
    `START_AT` its sequence value, `IS_DELETE`, `ORDER` 1 + its source position in the batch, `UNCHANGED`."""
    rows = _row_changes(history)
    deletes = pc.is_in(rows.column(Meta.KIND), pa.array([ChangeKind.DELETE.value, ChangeKind.UPDATE_BEFORE.value]))
    position = pc.sort_indices(rows, [(c, "ascending") for c in _ORDER])
    order = np.empty(rows.num_rows, dtype=np.int64)
    order[position.to_numpy()] = np.arange(1, rows.num_rows + 1)
    data = rows.select([c for c in rows.column_names if c not in HISTORY_META])
    return (data.append_column(START_AT, _sequence(rows, table)).append_column(IS_DELETE, deletes)
            .append_column(ORDER, pa.array(order)).append_column(UNCHANGED, rows.column(Meta.UNCHANGED)))


class HistorySink:
    """Keeps one history table in step with a pipeline's changes (see the module's text)."""

    def __init__(self, table: DeltaEngineTable, primary_key: tuple[str, ...], settings: HistorySettings,
                 schema_changes: SchemaChanges = "lenient") -> None:
        self.table = table
        self.primary_key = primary_key
        self.settings = settings
        self.schema_changes = schema_changes

    def already_committed(self, app_id: str, batch_id: int) -> bool:
        """True when this batch's commit is already in the history table (a replay)."""
        last = self.table.last_batch(app_id)
        return last is not None and last >= batch_id

    def apply(self, history: pa.Table | None, app_id: str, batch_id: int) -> HistoryOutcome:
        """Bring the history of the batch's keys up to date with its row changes (`BatchChanges.history`;
        None: none)."""
        if self.already_committed(app_id, batch_id):
            return HistoryOutcome(batch_id, 0, 0, 0, skipped_replay=True)
        if history is None or history.num_rows == 0:
            return HistoryOutcome(batch_id, 0, 0, 0)
        events = batch_events(history, self.table.uri)
        if events.num_rows == 0:
            return HistoryOutcome(batch_id, 0, 0, 0)
        existing = self.table.schema()
        if existing is not None:
            data_schema = pa.schema([f for f in existing if f.name not in (START_AT, END_AT, UPDATED_AT, DELETED)])
            control = [START_AT, IS_DELETE, ORDER, UNCHANGED]
            data = conform(events.drop_columns(control), data_schema, self.table.uri, self.schema_changes)
            if data.widen:
                self.table.widen(data.widen, app_id, batch_id)
            events = pa.Table.from_arrays([*data.batch.columns, *(events.column(c) for c in control)],
                                          names=[*data.batch.column_names, *control])
        touched = events.select(list(self.primary_key)).group_by(list(self.primary_key)).aggregate([])
        stored = self.table.rows_with_keys(touched) if existing is not None else None
        if stored is not None and stored.num_rows:
            old = stored_events(stored, self.primary_key)
            if old.schema != events.schema:
                old = old.cast(pa.schema([old.schema.field(n) if n not in events.column_names
                                          else events.schema.field(n) for n in old.column_names]))
            events = pa.concat_tables([old, events], promote_options="default")
        tracked = self.settings.tracked([c for c in events.column_names
                                         if c not in (START_AT, IS_DELETE, ORDER, UNCHANGED)],
                                        self.primary_key)
        new = recompute(events, self.primary_key, tracked, self.settings.delete_markers)
        if stored is None or stored.num_rows == 0:
            stored = new.schema.empty_table()
        changes = changed_rows(new, stored, self.primary_key, DELETE_FLAG)
        if changes.num_rows == 0:
            return HistoryOutcome(batch_id, touched.num_rows, 0, 0)
        if existing is None:
            self.table.create(changes.drop_columns([DELETE_FLAG]).schema)
        self.table.merge(changes, (*self.primary_key, START_AT), app_id, batch_id)
        removed = pc.sum(changes.column(DELETE_FLAG)).as_py() or 0
        return HistoryOutcome(batch_id, touched.num_rows, changes.num_rows - removed, removed)
