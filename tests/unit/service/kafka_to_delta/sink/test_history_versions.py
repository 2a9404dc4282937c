"""The SCD type 2 recomputation against a plain walk over every change of the source, sorted by sequence."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.delta.merge_plan import DELETE_FLAG
from service.config.history import DELETED, END_AT, START_AT, UPDATED_AT
from service.kafka_to_delta.sink.history_versions import (
    IS_DELETE,
    ORDER,
    UNCHANGED,
    changed_rows,
    recompute,
    stored_events,
)
from tests.support.history_reference import reference

EXAMPLES = settings(max_examples=60, derandomize=True, deadline=None)
KEY = ("id",)
SCHEMA = pa.schema([("id", pa.int64()), ("a", pa.string()), ("b", pa.int64()), (START_AT, pa.int64()),
                    (IS_DELETE, pa.bool_()), (ORDER, pa.int64())])
# (id, sequence, delete?, a, b): small domains so that keys, sequences and values repeat.
change = st.tuples(st.integers(1, 3), st.integers(0, 12), st.booleans(), st.sampled_from(["x", "y", None]),
                   st.integers(0, 2))


def _events(changes: list[tuple], first_order: int) -> pa.Table:
    return pa.Table.from_pylist(
        [{"id": i, "a": a, "b": b, START_AT: s, IS_DELETE: d, ORDER: first_order + n}
         for n, (i, s, d, a, b) in enumerate(changes)], SCHEMA)


def apply_batches(batches: list[list[tuple]], tracked: tuple[str, ...], markers: bool) -> pa.Table:
    """The history after each batch was recomputed with the rows stored before it (as the sink does)."""
    stored: pa.Table | None = None
    for batch in batches:
        events = _events(batch, 1)
        if stored is not None and stored.num_rows:
            touched = pa.table({"id": sorted({c[0] for c in batch})})
            mine = stored.join(touched, keys=["id"], join_type="left semi")
            others = stored.join(touched, keys=["id"], join_type="left anti")
            events = pa.concat_tables([stored_events(mine, KEY).select(SCHEMA.names).cast(SCHEMA), events])
            stored = pa.concat_tables([others, recompute(events, KEY, tracked, markers)])
        else:
            stored = recompute(events, KEY, tracked, markers)
    assert stored is not None
    return stored


def _rows(table: pa.Table) -> list[dict]:
    return sorted(table.select(["id", "a", "b", START_AT, END_AT, UPDATED_AT, DELETED]).to_pylist(),
                  key=lambda r: (r["id"], r[START_AT]))


def _split(changes: list[tuple], cuts: list[int]) -> list[list[tuple]]:
    bounds = sorted({min(c, len(changes)) for c in cuts} | {0, len(changes)})
    return [changes[lo:hi] for lo, hi in zip(bounds, bounds[1:]) if hi > lo]


@EXAMPLES
@given(st.lists(change, min_size=1, max_size=25), st.lists(st.integers(0, 25), max_size=4), st.booleans())
def test_every_column_tracked_any_disorder_across_batches(changes, cuts, markers):
    """With every column tracked, batches in any sequence order (late older changes, duplicates, re-inserts,
    deletes of absent keys) end with the history of the whole list."""
    got = apply_batches(_split(changes, cuts), ("a", "b"), markers)
    assert _rows(got) == reference(changes, ("a", "b"), markers)


@EXAMPLES
@given(st.lists(change, min_size=1, max_size=25), st.lists(st.integers(0, 25), max_size=4), st.booleans())
def test_untracked_columns_update_in_place(changes, cuts, markers):
    """Only changes of `a` open versions; `b` is updated in place. Within a batch in any order, batches
    in sequence order: the history of the whole list."""
    ordered = sorted(changes, key=lambda c: c[1])  # stable: equal sequences keep their delivery order
    batches = [sorted(batch, key=lambda c: -c[1]) for batch in _split(ordered, cuts)]  # disorder within a batch
    delivered = [c for batch in batches for c in batch]
    # At an equal sequence the later delivery wins: the reference sees the same delivery order.
    got = apply_batches(batches, ("a",), markers)
    assert _rows(got) == reference(delivered, ("a",), markers)


@EXAMPLES
@given(st.lists(change, min_size=1, max_size=25), st.lists(st.integers(0, 25), max_size=4), st.booleans())
def test_a_replayed_batch_changes_nothing(changes, cuts, markers):
    """Recomputing with a batch applied twice gives rows identical to the stored ones: nothing to MERGE."""
    batches = _split(changes, cuts)
    once = apply_batches(batches, ("a",), markers)
    twice = apply_batches([*batches, batches[-1]], ("a",), markers)
    assert _rows(twice) == _rows(once)
    assert changed_rows(twice, once, KEY, DELETE_FLAG).num_rows == 0


def test_a_late_older_update_lands_in_its_place():
    """Versions at 10 and 30; an update at 20 arrives last: it ends the first version and is ended by the second."""
    first = [(1, 10, False, "x", 0), (1, 30, False, "z", 0)]
    history = apply_batches([first, [(1, 20, False, "y", 0)]], ("a",), False)
    assert _rows(history) == [
        {"id": 1, "a": "x", "b": 0, START_AT: 10, END_AT: 20, UPDATED_AT: 10, DELETED: False},
        {"id": 1, "a": "y", "b": 0, START_AT: 20, END_AT: 30, UPDATED_AT: 20, DELETED: False},
        {"id": 1, "a": "z", "b": 0, START_AT: 30, END_AT: None, UPDATED_AT: 30, DELETED: False},
    ]


def test_changed_rows_replace_update_and_delete():
    """Against the stored rows: an identical row is left out, a changed one replaced, a missing one deleted."""
    def row(start, end, a):
        return {"id": 1, "a": a, "b": 0, START_AT: start, END_AT: end, UPDATED_AT: start, DELETED: False}
    schema = pa.schema([("id", pa.int64()), ("a", pa.string()), ("b", pa.int64()), (START_AT, pa.int64()),
                        (END_AT, pa.int64()), (UPDATED_AT, pa.int64()), (DELETED, pa.bool_())])
    stored = pa.Table.from_pylist([row(10, 30, "x"), row(30, None, "z"), row(40, None, "w")], schema)
    new = pa.Table.from_pylist([row(10, 20, "x"), row(20, 30, "y"), row(30, None, "z")], schema)
    got = changed_rows(new, stored, KEY, DELETE_FLAG).to_pylist()
    assert [(r[START_AT], r[END_AT], r[DELETE_FLAG]) for r in got] == [(10, 20, False), (20, 30, False),
                                                                       (40, None, True)]


def test_a_column_left_unchanged_takes_the_previous_value_of_the_key():
    """An update whose `b` Debezium could not read (TOAST) keeps `b` of the key's previous event, whether that
    event is stored or in the same batch, delivered before or after it; another key's value is never taken."""
    schema = SCHEMA.append(pa.field(UNCHANGED, pa.string()))
    def event(key, seq, a, b, unchanged=None, order=1):
        return {"id": key, "a": a, "b": b, START_AT: seq, IS_DELETE: False, ORDER: order, UNCHANGED: unchanged}
    batch = pa.Table.from_pylist([event(1, 20, "y", None, '["b"]', 1), event(1, 10, "x", 5, None, 2),
                                  event(2, 15, "x", None, '["b"]', 3)], schema)
    first = recompute(batch, KEY, ("a",), False)
    assert [(r["id"], r[START_AT], r["b"]) for r in _rows(first)] == [(1, 10, 5), (1, 20, 5), (2, 15, None)]
    later = pa.Table.from_pylist([event(1, 30, "z", None, '["b"]')], schema)
    old = stored_events(first.filter(pc.equal(first.column("id"), 1)), KEY).select(SCHEMA.names)
    again = recompute(pa.concat_tables([old, later], promote_options="default"), KEY, ("a",), False)
    assert [(r[START_AT], r["b"]) for r in _rows(again)] == [(10, 5), (20, 5), (30, 5)]
