"""Property tests: any legal interleaving of a changelog materializes to the in-order result.

A workload is a random sequence of inserts, updates (which may move a row to another primary key)
and deletes of a few rows identified by `id` (the upsert key); the sink table is keyed by `pk`.
Its in-order changelog is shuffled the way Kafka can: each upsert key goes to one of 4 partitions,
partitions interleave at random, order inside a partition is kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.kafka_to_delta.materialize.key_state import KeyMode
from service.kafka_to_delta.materialize.rules import (
    Change,
    Materializer,
    MaterializerConfig,
    OnConflict,
)
from tests.unit.service.kafka_to_delta.materialize.test_rules import Harness, canon
from vocabulary.changes import ChangeKind

settings.register_profile("materializer", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PROFILE = settings.get_profile("materializer")
IDS = range(4)
PKS = ("p0", "p1", "p2")
PARTITIONS = 4
INS, UB, UA, DEL = ChangeKind.INSERT, ChangeKind.UPDATE_BEFORE, ChangeKind.UPDATE_AFTER, ChangeKind.DELETE


@dataclass(frozen=True)
class Event:
    """One row of the in-order changelog; `step` is the source operation it came from."""

    kind: ChangeKind
    row: dict
    step: int

    @property
    def pk(self) -> str:
        return canon([self.row["pk"]])


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[Event], dict[str, str]]:
    """An in-order changelog and the table it leaves: at most one live row per pk at the end."""
    live: dict[int, dict] = {}
    events: list[Event] = []
    ops = draw(
        st.lists(st.tuples(st.sampled_from(IDS), st.sampled_from(PKS), st.integers(0, 2), st.booleans()), max_size=25)
    )
    for step, (id_, pk, value, delete) in enumerate(ops):
        row, old = {"id": id_, "pk": pk, "v": value}, live.get(id_)
        if old is None and not delete:
            events.append(Event(INS, row, step))
            live[id_] = row
        elif old is not None and delete:
            events.append(Event(DEL, live.pop(id_), step))
        elif old is not None:
            events += [Event(UB, old, step), Event(UA, row, step)]
            live[id_] = row
    # End without conflicts: per pk keep one live row, delete the others.
    for pk in PKS:
        holders = sorted(i for i, row in live.items() if row["pk"] == pk)
        if len(holders) > 1:
            keep = draw(st.sampled_from(holders))
            for step, id_ in enumerate((i for i in holders if i != keep), start=len(ops)):
                events.append(Event(DEL, live.pop(id_), step))
    return events, {canon([row["pk"]]): canon(row) for row in live.values()}


def upsert_key(event: Event, key_mode: KeyMode) -> str:
    return canon([event.row["id"]]) if key_mode == "upsert_key" else canon(event.row)


def interleave(data: st.DataObject, events: list[Event], key_mode: KeyMode, with_sequence: bool) -> list[tuple]:
    """A legal arrival order as routed (pk, Change): per upsert key the order is kept."""
    queues: dict[int, list[Event]] = {p: [] for p in range(PARTITIONS)}
    partition_of: dict[str, int] = {}
    for event in events:
        key = upsert_key(event, key_mode)
        if key not in partition_of:
            partition_of[key] = data.draw(st.integers(0, PARTITIONS - 1), label=f"partition of {key}")
        queues[partition_of[key]].append(event)
    offsets = dict.fromkeys(queues, 0)
    routed = []
    while any(queues.values()):
        partition = data.draw(st.sampled_from([p for p, q in queues.items() if q]))
        event = queues[partition].pop(0)
        position = ("src", partition, offsets[partition])
        offsets[partition] += 1
        sequence = (event.step,) if with_sequence else None
        change = Change(event.kind, upsert_key(event, key_mode), canon(event.row), position, sequence, key_mode)
        routed.append((event.pk, change))
    return routed


def split(data: st.DataObject, routed: list[tuple]) -> list[list[tuple]]:
    """Cut the arrival order into consecutive barriers at random."""
    cuts = sorted(data.draw(st.sets(st.integers(1, max(len(routed) - 1, 1)), max_size=8), label="cuts"))
    bounds = [0, *[c for c in cuts if c < len(routed)], len(routed)]
    return [routed[a:b] for a, b in zip(bounds, bounds[1:])]


KEY_MODES: tuple[KeyMode, ...] = ("upsert_key", "whole_row")


@pytest.mark.parametrize("with_sequence", [False, True])
@pytest.mark.parametrize("key_mode", KEY_MODES)
@pytest.mark.parametrize("on_conflict", ["error", "nothing"])
@PROFILE
@given(workload=workloads(), data=st.data())
def test_one_barrier_materializes_the_in_order_result(
    on_conflict: OnConflict, key_mode: KeyMode, with_sequence: bool, workload, data: st.DataObject
) -> None:
    events, expected = workload
    h = Harness(Materializer(MaterializerConfig("t", ("pk",), on_conflict)))
    h.barrier(interleave(data, events, key_mode, with_sequence))
    assert h.table == expected
    assert h.totals.stale_dropped == 0 and h.totals.cleared_state_warnings == 0
    assert h.totals.live_rows == len(expected)


@pytest.mark.parametrize("with_sequence", [False, True])
@pytest.mark.parametrize("key_mode", KEY_MODES)
@PROFILE
@given(workload=workloads(), data=st.data())
def test_deduplicate_materializes_the_in_order_result_for_any_barriers(
    key_mode: KeyMode, with_sequence: bool, workload, data: st.DataObject
) -> None:
    events, expected = workload
    h = Harness(Materializer(MaterializerConfig("t", ("pk",), "deduplicate")))
    for barrier in split(data, interleave(data, events, key_mode, with_sequence)):
        h.barrier(barrier)
    assert h.table == expected
    assert h.totals.stale_dropped == 0 and h.totals.cleared_state_warnings == 0
    live = sum(len(json.loads(s)["l"]) for s in h.states.values())
    assert live == len(expected)


@st.composite
def upsert_streams(draw: st.DrawFn) -> tuple[list[list[Change]], dict[str, str]]:
    """Debezium-style records keyed by id (pk = upsert key) with a sequence, and the final table.

    An update record yields -U and +U with the same sequence and position; they stay together.
    """
    live: dict[int, str] = {}
    records: list[list[Change]] = []
    ops = draw(st.lists(st.tuples(st.sampled_from(IDS), st.integers(0, 3), st.booleans()), max_size=25))
    for offset, (id_, value, delete) in enumerate(ops):
        key, row, old = canon([id_]), canon({"id": id_, "v": value}), live.get(id_)
        position = ("cdc", 0, offset)
        if delete and old is not None:
            records.append([Change(DEL, key, live.pop(id_), position, (offset,))])
        elif not delete and old is not None:
            records.append([Change(UB, key, old, position, (offset,)), Change(UA, key, row, position, (offset,))])
            live[id_] = row
        elif not delete:
            records.append([Change(INS, key, row, position, (offset,))])
            live[id_] = row
    return records, {canon([i]): row for i, row in live.items()}


@PROFILE
@given(stream=upsert_streams(), data=st.data())
def test_sequence_by_makes_any_record_order_converge(stream, data: st.DataObject) -> None:
    records, expected = stream
    shuffled = [change for record in data.draw(st.permutations(records), label="arrival order") for change in record]
    h = Harness(Materializer(MaterializerConfig("t", ("id",), "error", tombstone_retention_ms=0)))
    for barrier in split(data, [(c.upsert_key, c) for c in shuffled]):
        h.barrier(barrier, now_ms=0)
    assert h.table == expected
