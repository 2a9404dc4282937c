"""Offset maps and admission control (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from connectors.kafka import offsets as om
from connectors.kafka.offsets import cap_rows, from_map, split_spans, to_map


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


def test_a_lone_range_is_cut_in_halves_for_the_slots():
    spans = [(("t", 0), 100, 10_100)]
    assert split_spans(spans, 2, 1_000) == [(("t", 0), 100, 5_100), (("t", 0), 5_100, 10_100)]
    assert split_spans(spans, 4, 1_000) == [
        (("t", 0), 100, 2_600), (("t", 0), 2_600, 5_100), (("t", 0), 5_100, 7_600), (("t", 0), 7_600, 10_100)]


def test_small_ranges_and_enough_ranges_stay_whole():
    assert split_spans([(("t", 0), 0, 1_999)], 2, 1_000) == [(("t", 0), 0, 1_999)]
    enough = [(("t", 0), 0, 50_000), (("t", 1), 0, 10)]
    assert split_spans(enough, 2, 1_000) == enough


@given(
    st.lists(st.integers(min_value=1, max_value=20_000), min_size=0, max_size=6),
    st.integers(min_value=1, max_value=8),
    st.integers(min_value=1, max_value=5_000),
)
def test_pieces_cover_each_partition_exactly_in_order(sizes, min_pieces, min_rows):
    spans = [(("t", p), 1_000 * p, 1_000 * p + size) for p, size in enumerate(sizes)]
    pieces = split_spans(spans, min_pieces, min_rows)
    for tp, first, stop in spans:
        own = [(a, b) for piece_tp, a, b in pieces if piece_tp == tp]
        assert own[0][0] == first and own[-1][1] == stop
        assert all(a < b and b == next_a for (a, b), (next_a, _) in zip(own, own[1:]))
        if len(own) > 1:
            assert all(b - a >= min_rows for a, b in own)
    assert [tp for tp, _, _ in pieces] == sorted(tp for tp, _, _ in pieces)
    assert len(pieces) <= max(len(spans), min_pieces)
    if len(pieces) < min_pieces:  # stopped early only because no piece could be cut again
        assert all(b - a < 2 * min_rows for _, a, b in pieces)


def _topics(backlogs: dict[str, int], partitions: int = 2) -> tuple[dict, dict]:
    start = {(t, p): 100 for t in backlogs for p in range(partitions)}
    available = {(t, p): 100 + lag // partitions + (p < lag % partitions) for t, lag in backlogs.items()
                 for p in range(partitions)}
    return start, available


def _admitted(start: dict, end: dict) -> dict[str, int]:
    found: dict[str, int] = {}
    for (topic, partition), stop in end.items():
        found[topic] = found.get(topic, 0) + stop - start[(topic, partition)]
    return {t: n for t, n in found.items() if n}


def test_cap_rows_by_topic_admits_whole_topics_smallest_first():
    backlogs = {f"t{i:03d}": 1_070 for i in range(200)}  # 214,000 records, limit 200,000
    start, available = _topics(backlogs)
    admitted = _admitted(start, om.cap_rows_by_topic(start, available, 200_000))
    assert sum(admitted.values()) == 200_000
    assert sum(n == 1_070 for n in admitted.values()) >= 185  # whole topics; at most one cut
    assert sum(0 < n < 1_070 for n in admitted.values()) <= 2
    # The proportional cap touches every topic in both batches.
    assert len(_admitted(start, om.cap_rows(start, available, 200_000))) == 200


def test_cap_rows_by_topic_always_serves_the_largest_backlog():
    start, available = _topics({"big": 1_000_000, **{f"s{i}": 1_000 for i in range(300)}})
    admitted = _admitted(start, om.cap_rows_by_topic(start, available, 200_000))
    assert admitted["big"] >= 50_000 and sum(admitted.values()) == 200_000
    start, available = _topics({"a": 10, "b": 20})
    assert om.cap_rows_by_topic(start, available, None) == available
    assert om.cap_rows_by_topic(start, available, 1_000) == available


@given(st.dictionaries(st.sampled_from([f"t{i}" for i in range(12)]), st.integers(0, 5_000), min_size=1),
       st.integers(1, 20_000))
def test_cap_rows_by_topic_stays_within_bounds_and_makes_progress(backlogs, max_rows):
    start, available = _topics(backlogs)
    end = om.cap_rows_by_topic(start, available, max_rows)
    assert set(end) == set(available)
    assert all(start[tp] <= end[tp] <= available[tp] for tp in end)
    admitted = sum(end[tp] - start[tp] for tp in end)
    assert admitted == min(max_rows, sum(available[tp] - start[tp] for tp in end))


def test_the_cut_is_planned_from_the_end_offset_not_from_the_replaying_process():
    from connectors.kafka.source import KafkaStreamReader

    planner = KafkaStreamReader({"bootstrap.servers": "unused:9092", "topics": "t", "minPartitions": "2"})
    replayer = KafkaStreamReader({"bootstrap.servers": "unused:9092", "topics": "t", "minPartitions": "8"})
    start = {"t": {"0": 0}}
    end = {"t": {"0": 10_000}, **planner._pieces()}
    assert end[om.PIECES_KEY] == {"min_pieces": 2, "min_rows": 1_000}
    planned = [(r.start, r.end) for r in planner.partitions(start, end)]
    assert planned == [(0, 5_000), (5_000, 10_000)]
    assert [(r.start, r.end) for r in replayer.partitions(start, end)] == planned
    # an offset recorded before ranges were cut (or by a reader that does not cut) is read whole
    assert [(r.start, r.end) for r in replayer.partitions(start, {"t": {"0": 10_000}})] == [(0, 10_000)]


def test_the_pieces_entry_is_reserved_and_absent_without_a_cut():
    assert om.pieces_entry(0, 1_000) == {} and om.pieces_entry(1, 1_000) == {}
    assert om.planned_pieces({"t": {"0": 5}}) == (0, 0)
    assert from_map({"t": {"0": 5}, **om.pieces_entry(4, 10)}) == {("t", 0): 5}
