"""The rules' common case (`rules_fast`) for a whole bucket call at once, on its Arrow columns.

The bucket stage used to turn every change of a call into a Python dict, sort them by arrival, group
them by key and decide each key in Python (`bulk.compact_many`); building the net rows took another
dict per key. For the keys of the common shape (`rules_fast.simple_outcome`: one upsert key, no
sequence_by, a stored state of at most that upsert key's live row) the outcome depends on the key's
last change alone, so here the changes are sorted by (key, arrival) in Arrow, each key's last change is
found from the group boundaries, and the net rows are taken as columns (with the winner's typed image
columns where the changes carry them). The stored states are read and the new ones written on columns too
(`key_state_columns`), and the winners' digests hashed from the row column's buffer (`row_digest.row_digests`):
Python touches each key only to hash its winner and to put its new state in the call's dict.

A key is left to the rules (its changes returned as dicts, in arrival order, for `compact_many`) when
any of its changes falls outside the common shape, when its stored state does, when a retraction finds
no live row (the rules log that warning with the change's coordinates), or when its winning change
leaves columns unchanged after earlier changes of the key (`bulk.net_values` fills those from their
images; a winner alone in the call passes its unchanged columns on as they are). Failed rows are left to
it as well (they pass through).

Only for `batch` compaction in upsert-key mode without a state TTL: the bucket stage calls it then.
tests/unit/service/kafka_to_delta/materialize/test_rules_columns.py holds its net rows and states equal
to `compact_many`'s on random calls.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from service.kafka_to_delta.materialize.bucket_document import StoredState
from service.kafka_to_delta.materialize.bulk import ARRIVAL_ORDER, ERROR_PREFIX
from service.kafka_to_delta.materialize.key_state_columns import StoredRows, escaped, one_row_states
from service.kafka_to_delta.materialize.row_digest import PREFIX
from service.kafka_to_delta.materialize.row_digest import row_digests as digests_of
from service.kafka_to_delta.rows.ipc import table_records
from service.kafka_to_delta.rows.names import CHANGES_COLUMN, GROUP, Column, typed_names
from service.kafka_to_delta.rows.spark import NET_ARROW_SCHEMA
from vocabulary.changes import ChangeKind

_ADDS = pa.array([ChangeKind.INSERT.value, ChangeKind.UPDATE_AFTER.value])
_RETRACTIONS = pa.array([ChangeKind.UPDATE_BEFORE.value, ChangeKind.DELETE.value])
_UPSERT, _DELETE = ChangeKind.UPDATE_AFTER.value, ChangeKind.DELETE.value
_ZERO_COUNTERS = ("conflicts", "rollbacks", "stale_dropped", "cleared_state_warnings")
_NONE = (None, None)
_NO_TEXT = pa.scalar(None, pa.string())


def compact_columns(changes: pa.Table, states: dict[str, StoredState],
                    row_digests: bool) -> tuple[pa.Table | None, list[dict]]:
    """(the net rows, `NET_ARROW_SCHEMA`, of the keys decided here; the changes of the others as records in
    arrival order per key, for `compact_many`). `states` (the touched keys' stored states) is updated in place
    for the keys decided here. `changes`: a call's changes (`STAGE_FIELDS`, any order)."""
    if changes.num_rows == 0:
        return None, []
    typed = typed_names(changes.column_names)
    if any(changes.column(name).null_count for name in ARRIVAL_ORDER):
        return None, table_records(changes.drop_columns(typed))
    ordered = _Sorted(changes)
    count = changes.num_rows
    group = ordered.column(GROUP)
    kind = ordered.column(Column.KIND)
    upsert_key = ordered.column(Column.UPSERT_KEY)
    starts_mask = np.ones(count, np.bool_)
    if count > 1:
        changed = pc.not_equal(group.slice(1), group.slice(0, count - 1))
        starts_mask[1:] = pc.fill_null(changed, True).to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(starts_mask)
    ends = np.append(starts[1:], count) - 1
    first_of_row = starts[np.cumsum(starts_mask) - 1]

    is_add = _flags(pc.is_in(kind, value_set=_ADDS))
    is_retraction = _flags(pc.is_in(kind, value_set=_RETRACTIONS))
    row_ok = (is_add | is_retraction) & _flags(pc.invert(pc.starts_with(group, ERROR_PREFIX)))
    row_ok &= ~_flags(ordered.valid(Column.SEQUENCE))
    row_ok &= ~(is_add & ~_flags(ordered.valid(Column.ROW)))
    row_ok &= _flags(pc.equal(upsert_key, upsert_key.take(pa.array(first_of_row))))
    # A retraction right after another finds no live row: the rules log it.
    row_ok[1:] &= ~(is_retraction[1:] & is_retraction[:-1] & ~starts_mask[1:])
    key_ok = np.logical_and.reduceat(row_ok, starts)
    # A winner leaving columns unchanged after earlier changes of its key is filled from their images
    # (`bulk.net_values`); alone in the call, it is passed on as it is.
    key_ok &= ~(_flags(pc.is_valid(ordered.at(Column.UNCHANGED, ends))) & (ends > starts))

    at_starts = pa.array(starts)
    keys = group.take(at_starts)
    stored_texts = pa.array([states.get(key, _NONE)[0] for key in keys.to_pylist()], pa.string())
    stored = StoredRows(stored_texts)
    upsert = upsert_key.take(at_starts)
    emitted = stored.row  # the live row as it stands in the state text (escaped), null: none
    # A stored state in another layout, or naming another upsert key, or (keeping digests) holding a row's
    # text, is the rules' (`digested_state`).
    common = pc.or_(pc.is_null(stored_texts), stored.matched)
    common = pc.and_kleene(common, pc.fill_null(pc.equal(stored.upsert_key, escaped(upsert)), True))
    if row_digests:
        common = pc.and_kleene(common, pc.fill_null(pc.starts_with(emitted, PREFIX), True))
    key_ok &= _flags(common)
    key_ok &= ~(is_retraction[starts] & ~_flags(pc.is_valid(emitted)))  # the rules log a retraction finding none
    adds = is_add[ends]
    winners = ordered.at(Column.ROW, ends)
    # The kept rows as the state text holds them: a digest needs no escape (`PREFIX` and base64's URL alphabet).
    kept = digests_of(winners, key_ok & adds) if row_digests else escaped(winners)
    texts = one_row_states(upsert, kept, *(ordered.at(name, ends) for name in (Column.TOPIC, Column.PARTITION,
                                                                                   Column.OFFSET)))
    texts = pc.if_else(pa.array(adds), texts, _NO_TEXT)
    same = pc.fill_null(pc.equal(kept, emitted), False)
    kinds = pc.if_else(pa.array(adds), pc.if_else(same, _NO_TEXT, _UPSERT),
                       pc.if_else(pc.is_valid(emitted), _DELETE, _NO_TEXT))
    chosen = pa.array(key_ok)
    for key, text in zip(keys.filter(chosen).to_pylist(), texts.filter(chosen).to_pylist()):
        if text is None:
            states.pop(key, None)
        else:
            states[key] = (text, None)
    left = np.repeat(~key_ok, ends - starts + 1)
    rest = table_records(ordered.rows(left, typed)) if left.any() else []
    if not key_ok.any():
        return None, rest
    decided = np.flatnonzero(key_ok)
    with_types = np.where(_flags(ordered.valid(Column.TYPES)), np.arange(count), -1)
    last_types = np.maximum.reduceat(with_types, starts)  # each key's last change declaring types, or -1
    state_bytes = pc.fill_null(pc.binary_length(texts), 0).filter(chosen)
    return _net_rows(ordered, starts[decided], ends[decided], last_types[decided], kinds.filter(chosen),
                     state_bytes), rest


class _Sorted:
    """A call's changes in (group, arrival) order, taken column by column where they are read: sorting the
    whole table copied every column, the row texts and typed images included, where only the winners'
    are read. A column read is joined into one chunk once (the call's changes come in a chunk per packed
    piece, and a take from several chunks joins them again for each take)."""

    def __init__(self, changes: pa.Table) -> None:
        self.changes = changes
        self.order = pc.sort_indices(changes, sort_keys=[(name, "ascending") for name in (GROUP, *ARRIVAL_ORDER)])
        self._joined: dict[str, pa.Array] = {}

    def _column(self, name: str) -> pa.Array:
        joined = self._joined.get(name)
        if joined is None:
            joined = self._joined[name] = self.changes.column(name).combine_chunks()
        return joined

    def column(self, name: str) -> pa.Array:
        return self._column(name).take(self.order)

    def valid(self, name: str) -> pa.ChunkedArray:
        """Whether each change (in order) has a value in `name` (its validity taken, not the column joined)."""
        return pc.is_valid(self.changes.column(name)).take(self.order)

    def at(self, name: str, positions: np.ndarray) -> pa.Array:
        """`name` at `positions` of the order (masked positions, negative: null)."""
        return self._column(name).take(self.order.take(pa.array(positions, mask=positions < 0)))

    def rows(self, chosen: np.ndarray, without: list[str]) -> pa.Table:
        """The changes at the `chosen` positions of the order, without the columns `without` (each taken from
        its joined column: the row texts are joined already, for the winners)."""
        positions = self.order.filter(pa.array(chosen))
        schema = pa.schema([field for field in self.changes.schema if field.name not in without])
        return pa.Table.from_arrays([self._column(field.name).take(positions) for field in schema], schema=schema)


def _flags(mask: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean column as numpy (null: False)."""
    return pc.fill_null(mask, False).to_numpy(zero_copy_only=False)


def _net_rows(ordered: _Sorted, starts: np.ndarray, ends: np.ndarray, last_types: np.ndarray,
              kind: pa.Array, state_bytes: pa.Array) -> pa.Table:
    """The net rows (`bulk.net_values`) of the keys whose changes run from `starts` to `ends` in `ordered`
    (`last_types`: the position of each key's last change declaring column types, or -1)."""
    columns = {
        Column.KEY: ordered.at(GROUP, ends),
        Column.KIND: kind,
        Column.ROW: pc.if_else(pc.equal(kind, _UPSERT), ordered.at(Column.ROW, ends), None),
        Column.UNCHANGED: pc.if_else(pc.equal(kind, _UPSERT), ordered.at(Column.UNCHANGED, ends), None),
        Column.TYPES: ordered.at(Column.TYPES, last_types),
        CHANGES_COLUMN: pa.array(ends - starts + 1, pa.int64()),
        "state_bytes": state_bytes,
        **{name: pa.array(np.zeros(len(kind), np.int64)) for name in _ZERO_COUNTERS},
        **{name: ordered.at(name, ends) for name in (Column.TOPIC, Column.PARTITION, Column.OFFSET, Column.TIMESTAMP)},
    }
    arrays = [columns[field.name].cast(field.type) if field.name in columns else pa.nulls(len(kind), field.type)
              for field in NET_ARROW_SCHEMA]
    net = pa.Table.from_arrays(arrays, schema=NET_ARROW_SCHEMA)
    for name in typed_names(ordered.changes.column_names):  # the winner's typed image: the net row's (`payload`)
        net = net.append_column(ordered.changes.schema.field(name), ordered.at(name, ends))
    return net
