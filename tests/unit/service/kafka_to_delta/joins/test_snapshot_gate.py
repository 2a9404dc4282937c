"""The snapshot gate rule of the enrichment join (service/kafka_to_delta/joins/snapshot_gate.py): no Spark, no Kafka."""

from __future__ import annotations

import pytest

from service.kafka_to_delta.joins.snapshot_gate import (
    BuildObservations,
    GateState,
    is_snapshot,
    is_snapshot_end,
)

T, U = "customers", "addresses"


def _never(topic: str) -> dict[int, int]:
    raise AssertionError(f"end offsets of {topic} asked without a snapshot-end marker")


def _ends(**per_topic: dict[int, int]):
    return lambda topic: per_topic[topic]


@pytest.mark.parametrize("marker, snapshot, end", [
    ("first", True, False), ("true", True, False), ("TRUE", True, False), ("last", True, True),
    ("first_in_data_collection", True, False), ("last_in_data_collection", True, True),
    ("false", False, False), (None, False, False), ("incremental", False, False),
])
def test_snapshot_markers(marker, snapshot, end):
    assert is_snapshot(marker) is snapshot
    assert is_snapshot_end(marker) is end


def test_closed_while_only_snapshot_records_are_read():
    seen = BuildObservations({(T, 0): 3, (T, 1): 2}, [((T, 0), "first"), ((T, 0), "true"), ((T, 1), "true")])
    state = GateState().advanced(0, [T], seen, _never)
    assert not state.open and state.opened_in_batch is None
    assert state.waiting_for([T]) == [f"{T}/0", f"{T}/1"]


def test_a_topic_with_no_partition_yet_keeps_the_gate_closed():
    state = GateState().advanced(0, [T], BuildObservations({}), _never)
    assert not state.open and state.waiting_for([T]) == [T]


def test_last_marker_opens_once_every_partition_is_read_to_the_end_offsets_recorded_then():
    # batch 0 reads `last` on partition 0 while partition 1 still has snapshot records unread
    seen = BuildObservations({(T, 0): 4, (T, 1): 1}, [((T, 0), "first"), ((T, 0), "true"), ((T, 0), "last")])
    state = GateState().advanced(0, [T], seen, _ends(customers={0: 4, 1: 3}))
    assert not state.open and state.marker_ends == {T: {0: 4, 1: 3}}
    assert state.waiting_for([T]) == [f"{T}/1"]
    state = state.advanced(1, [T], BuildObservations({(T, 0): 4, (T, 1): 2}, [((T, 1), "true")]), _never)
    assert not state.open
    state = state.advanced(2, [T], BuildObservations({(T, 0): 4, (T, 1): 3}, [((T, 1), "true")]), _never)
    assert state.open and state.opened_in_batch == 2


def test_end_offsets_are_recorded_once_at_the_first_marker():
    first = GateState().advanced(0, [T], BuildObservations({(T, 0): 1}, [((T, 0), "last")]), _ends(customers={0: 5}))
    again = first.advanced(1, [T], BuildObservations({(T, 0): 2}, [((T, 0), "last")]), _never)
    assert again.marker_ends == {T: {0: 5}} and not again.open


def test_a_streaming_record_completes_its_partition_without_a_marker():
    seen = BuildObservations({(T, 0): 3, (T, 1): 2}, [((T, 0), "true"), ((T, 0), "false"), ((T, 1), "true")])
    state = GateState().advanced(0, [T], seen, _never)
    assert not state.open and state.waiting_for([T]) == [f"{T}/1"]
    state = state.advanced(1, [T], BuildObservations({(T, 0): 3, (T, 1): 3}, [((T, 1), None)]), _never)
    assert state.open and state.opened_in_batch == 1


def test_partitions_the_marker_did_not_know_count_from_offset_zero():
    # an empty partition, created before the marker: complete at once; read offsets beyond the recorded end too
    seen = BuildObservations({(T, 0): 2, (T, 1): 0, (T, 2): 0}, [((T, 0), "first"), ((T, 0), "last")])
    state = GateState().advanced(0, [T], seen, _ends(customers={0: 2, 1: 0}))
    assert state.open


def test_every_build_topic_must_be_complete():
    seen = BuildObservations({(T, 0): 1, (U, 0): 1}, [((T, 0), "last"), ((U, 0), "true")])
    state = GateState().advanced(0, [T, U], seen, _ends(customers={0: 1}))
    assert not state.open and state.waiting_for([T, U]) == [f"{U}/0"]
    state = state.advanced(1, [T, U], BuildObservations({(U, 0): 2}, [((U, 0), "last_in_data_collection")]),
                           _ends(addresses={0: 2}))
    assert state.open


def test_an_open_gate_never_closes_and_keeps_no_bookkeeping():
    state = GateState().advanced(4, [T], BuildObservations({(T, 0): 1}, [((T, 0), "false")]), _never)
    assert state.open and state.opened_in_batch == 4
    later = state.advanced(5, [T], BuildObservations({(T, 0): 9, (T, 1): 3}, [((T, 1), "true")]), _never)
    assert later is state


def test_read_positions_never_go_back():
    state = GateState().advanced(0, [T], BuildObservations({(T, 0): 5}), _never)
    state = state.advanced(1, [T], BuildObservations({(T, 0): 3}), _never)
    assert state.read_to == {(T, 0): 5}


def test_json_round_trip_keeps_everything():
    seen = BuildObservations({(T, 0): 4, (T, 1): 1}, [((T, 0), "last"), ((T, 1), "false")])
    state = GateState().advanced(0, [T], seen, _ends(customers={0: 4, 1: 3}))
    assert GateState.from_json(state.to_json()) == state
    opened = GateState(open=True, opened_in_batch=7)
    assert GateState.from_json(opened.to_json()) == opened
