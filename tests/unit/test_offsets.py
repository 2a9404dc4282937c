"""Offset maps and admission control (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from connectors.kafka.offsets import cap_rows, from_map, to_map


def test_offset_map_round_trip_is_json_friendly():
    positions = {("a", 0): 5, ("a", 1): 7, ("b", 0): 0}
    mapped = to_map(positions)
    assert mapped == {"a": {"0": 5, "1": 7}, "b": {"0": 0}}
    assert from_map(mapped) == positions


def test_no_limit_reads_everything():
    assert cap_rows({("t", 0): 3}, {("t", 0): 10}, None) == {("t", 0): 10}


def test_limit_is_shared_in_proportion_to_backlog():
    start = {("t", 0): 0, ("t", 1): 0}
    end = cap_rows(start, {("t", 0): 300, ("t", 1): 100}, 100)
    assert end == {("t", 0): 75, ("t", 1): 25}


backlogs = st.dictionaries(st.tuples(st.sampled_from("abc"), st.integers(0, 5)),
                           st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1)


@given(backlogs, st.integers(1, 3000))
def test_cap_never_exceeds_limit_never_regresses_and_always_progresses(parts, limit):
    start = {tp: s for tp, (s, _) in parts.items()}
    available = {tp: s + lag for tp, (s, lag) in parts.items()}
    end = cap_rows(start, available, limit)
    admitted = sum(end[tp] - start[tp] for tp in parts)
    total = sum(lag for _, lag in parts.values())
    assert all(start[tp] <= end[tp] <= available[tp] for tp in parts)
    assert admitted == min(limit, total)
