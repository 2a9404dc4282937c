"""SCD type 2 versions of the touched keys, recomputed in Arrow from their stored history and a batch's changes.

A key's history is a walk over its events in sequence order: an upsert opens a version when no
version is open or a tracked column differs from the open version's, else it updates the open
version in place; a delete closes the open version. A version is valid from its first event's
sequence (`__START_AT`) to the next version's or the delete's (`__END_AT`; null while current);
`__UPDATED_AT` is the sequence of its last in-place update. A delete is kept as a marker row
(`__DELETED` true, the key's columns alone, valid until the key's next event) when it closes no version, so that an older
change arriving later is still closed by it; with delete markers, every delete is.

The stored rows of a key stand for its earlier events: each row an upsert at `__START_AT` (and
one at `__UPDATED_AT` when it was updated in place), each marker a delete, and each `__END_AT`
no row starts at a delete. With the batch's events added, the walk is run again for the touched
keys: a late older change lands in its place and its neighbours' validity follows, and a replay
(the same events again) gives the same rows. Of two events of a key at one sequence the later one
wins, a batch's over a stored one's. What a version's untracked columns held before its last
in-place update is not stored: a late change that splits such a version gives the earlier part
the values of that last update.

A column an event left unchanged (an unavailable TOAST value) takes the value of the key's previous
event that had one, among the events known when the event is first recomputed.

Every step is a sort, a comparison with the neighbouring row or a take: no per-row Python beyond
reading the list of unchanged columns of the events that have one.
"""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.delta.arrow_types import one_array
from service.config.history import DELETED, END_AT, START_AT, UPDATED_AT

ORDER = "__history_order"
"""An event's rank among events of one key at one sequence: stored ones 0, a batch's 1 + its source position."""
IS_DELETE = "__history_delete"
UNCHANGED = "__history_unchanged"
"""Optional: per event, the JSON list of columns the source left unchanged (an unavailable TOAST value), or null."""


def _same_as_previous(table: pa.Table, columns: Sequence[str]) -> np.ndarray:
    """Per row: every one of `columns` equals the previous row's (nulls equal each other); row 0 False."""
    n = table.num_rows
    same = np.zeros(n, dtype=bool)
    if n < 2:
        return same
    same[1:] = True
    for name in columns:
        column = one_array(table.column(name))
        now, before = column.slice(1), column.slice(0, n - 1)
        try:
            equal = pc.equal(now, before)
        except pa.ArrowNotImplementedError:  # nested types: compared as Python values
            equal = pa.array([a == b for a, b in zip(now.to_pylist(), before.to_pylist())], pa.bool_())
        both_null = pc.and_(pc.is_null(now), pc.is_null(before))
        same[1:] &= pc.fill_null(pc.or_kleene(equal, both_null), False).to_numpy(zero_copy_only=False)
    return same


def _next(flags: np.ndarray) -> np.ndarray:
    """Per row: the next row's flag (False for the last row)."""
    shifted = np.zeros_like(flags)
    shifted[:-1] = flags[1:]
    return shifted


def _previous(flags: np.ndarray) -> np.ndarray:
    shifted = np.zeros_like(flags)
    shifted[1:] = flags[:-1]
    return shifted


def _filled_unchanged(t: pa.Table, unchanged: pa.ChunkedArray, same_key: np.ndarray) -> pa.Table:
    """Each column an event left unchanged takes the value of the key's previous event that had it."""
    if unchanged.null_count == len(unchanged):
        return t
    flagged = np.flatnonzero(pc.is_valid(unchanged).to_numpy(zero_copy_only=False))
    lists = [json.loads(text) for text in unchanged.take(pa.array(flagged)).to_pylist()]  # the flagged rows only
    index = np.arange(t.num_rows)
    key_start = np.maximum.accumulate(np.where(same_key, 0, index))
    for name in sorted({column for columns in lists for column in columns} & set(t.column_names)):
        missing = np.zeros(t.num_rows, dtype=bool)
        missing[[row for row, columns in zip(flagged, lists) if name in columns]] = True
        source = np.maximum.accumulate(np.where(missing, -1, index))
        known = source >= key_start
        taken = t.column(name).take(pa.array(np.where(known, source, 0)))
        filled = pc.if_else(pa.array(known | ~missing), taken, pa.nulls(t.num_rows, taken.type))
        t = t.set_column(t.schema.get_field_index(name), t.schema.field(name), filled)
    return t


def stored_events(stored: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """The events the stored history rows of some keys stand for (columns: data, `START_AT`, `IS_DELETE`, `ORDER`)."""
    data = [c for c in stored.column_names if c not in (START_AT, END_AT, UPDATED_AT, DELETED)]
    deleted = pc.fill_null(stored.column(DELETED), False)
    at_start = stored.select([*data, START_AT]).append_column(IS_DELETE, deleted)
    updated = stored.filter(pc.and_(pc.invert(deleted), pc.fill_null(
        pc.not_equal(stored.column(UPDATED_AT), stored.column(START_AT)), False)))
    at_update = updated.select([*data, UPDATED_AT]).rename_columns([*data, START_AT]).append_column(
        IS_DELETE, pa.array(np.zeros(updated.num_rows, dtype=bool)))
    ended = stored.filter(pc.is_valid(stored.column(END_AT)))
    ends = ended.select([*data, END_AT]).rename_columns([*data, START_AT])
    starts = stored.select([*primary_key, START_AT])
    gaps = ends.join(starts, keys=[*primary_key, START_AT], join_type="left anti") if ends.num_rows else ends
    gaps = gaps.select([*data, START_AT]).append_column(IS_DELETE, pa.array(np.ones(gaps.num_rows, dtype=bool)))
    events = pa.concat_tables([at_start, at_update, gaps])
    return events.append_column(ORDER, pa.array(np.zeros(events.num_rows, dtype=np.int64)))


def recompute(events: pa.Table, primary_key: Sequence[str], tracked: Sequence[str],
              delete_markers: bool) -> pa.Table:
    """The history rows of the keys of `events` (data columns, `START_AT` the event's sequence,
    `IS_DELETE`, `ORDER`): versions, and marker rows for deletes (see the module's text)."""
    data = [c for c in events.column_names if c not in (START_AT, IS_DELETE, ORDER, UNCHANGED)]
    order = pc.sort_indices(events, [(c, "ascending") for c in (*primary_key, START_AT, ORDER)])
    t = events.take(order)
    same_key = _same_as_previous(t, primary_key)
    same_sequence = same_key & _same_as_previous(t, [START_AT])
    t = t.filter(pa.array(~_next(same_sequence)))  # the last event at one sequence wins
    same_key = _same_as_previous(t, primary_key)
    if UNCHANGED in t.column_names:
        t = _filled_unchanged(t.drop_columns([UNCHANGED]), t.column(UNCHANGED), same_key)
    upsert = ~t.column(IS_DELETE).to_numpy()
    after_upsert = same_key & _previous(upsert)
    unchanged = _same_as_previous(t, tracked) if tracked else np.ones(t.num_rows, dtype=bool)
    opening = upsert & (~after_upsert | ~unchanged)
    next_same_key = _next(same_key)
    last_of_version = upsert & ~(next_same_key & _next(upsert & ~opening))
    index = np.arange(t.num_rows)
    first = np.flatnonzero(opening)[np.maximum(np.cumsum(opening) - 1, 0)] if opening.any() else index
    sequence = t.column(START_AT)
    markers = ~upsert if delete_markers else ~upsert & ~after_upsert  # a delete that closes nothing is kept
    rows = np.flatnonzero(last_of_version | markers)
    following = np.minimum(rows + 1, max(t.num_rows - 1, 0))
    ended = pa.array(next_same_key[rows])
    starts = pc.if_else(pa.array(upsert[rows]), sequence.take(pa.array(first[rows])), sequence.take(pa.array(rows)))
    ends = pc.if_else(ended, sequence.take(pa.array(following)), pa.nulls(len(rows), sequence.type))
    result = t.select(data).take(pa.array(rows))
    is_version = pa.array(upsert[rows])
    for name in data:  # a marker holds its key alone
        if name not in primary_key:
            column = result.column(name)
            result = result.set_column(result.schema.get_field_index(name), result.schema.field(name),
                                       pc.if_else(is_version, column, pa.nulls(len(rows), column.type)))
    return (result.append_column(START_AT, starts).append_column(END_AT, ends)
            .append_column(UPDATED_AT, sequence.take(pa.array(rows)))
            .append_column(DELETED, pa.array(~upsert[rows])))


def changed_rows(new: pa.Table, stored: pa.Table, primary_key: Sequence[str], delete_flag: str) -> pa.Table:
    """What a MERGE on (key, `START_AT`) needs to turn `stored` into `new` (the same keys): the rows of `new`
    that differ from or are missing in `stored`, and `stored`'s (key, `START_AT`) missing in `new` with
    `delete_flag` set. Identical rows are left out (no change-feed rows for them)."""
    stored = stored.select(new.column_names).cast(new.schema)
    both = pa.concat_tables([new.append_column("__new", pa.array(np.ones(new.num_rows, dtype=bool))),
                             stored.append_column("__new", pa.array(np.zeros(stored.num_rows, dtype=bool)))])
    both = both.take(pc.sort_indices(both, [(c, "ascending") for c in (*primary_key, START_AT)]
                                     + [("__new", "ascending")]))
    paired = _same_as_previous(both, [*primary_key, START_AT])  # a stored row then its new one
    identical = paired & _same_as_previous(both, new.column_names)
    is_new = both.column("__new").to_numpy(zero_copy_only=False)
    replaced = _next(paired)  # a stored row followed by its new one: the new one says it all
    keep = np.where(is_new, ~identical, ~replaced)
    kept = both.filter(pa.array(keep))
    flag = pc.invert(kept.column("__new"))
    return kept.drop_columns(["__new"]).append_column(delete_flag, flag)
