"""Per-partition event-time watermarks combined as the minimum over active partitions (pure)."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from connectors.kafka.offsets import from_map
from connectors.kafka.watermarks import (
    NO_WATERMARK,
    PROGRESS_KEY,
    PartitionProgress,
    Progress,
    ProgressFile,
    aligned_shares,
    planned_floors,
)
from service.kafka_to_delta.source.event_time_progress import PartitionWatermark

P0, P1, P2 = ("t", 0), ("t", 1), ("t", 2)
IDLE_MS = 30_000


def progress(at_ms: int = 1_000, **parts: tuple[int | None, int | None]) -> Progress:
    return Progress({("t", int(k[1:])): PartitionProgress(*v) for k, v in parts.items()}, at_ms)


def test_combined_is_the_minimum_over_active_partitions():
    state = progress(p0=(500, None), p1=(200, None), p2=(900, None))
    assert state.combined(IDLE_MS) == 200
    assert state.floors([P0, P1], state.holding({}, IDLE_MS)) == {P0: 200, P1: 500}


def test_a_partition_not_read_yet_holds_the_watermark_back():
    state = progress(p0=(500, None), p1=(None, None))
    assert state.combined(IDLE_MS) == NO_WATERMARK
    assert state.floors([P0], state.holding({}, IDLE_MS)) == {P0: NO_WATERMARK}


def test_an_idle_partition_stops_holding_the_watermark_after_the_timeout():
    before = progress(at_ms=10_000, p0=(500, None), p1=(200, 0))
    assert before.combined(IDLE_MS) == 200  # idle for 10 s < 30 s: still holds
    after = progress(at_ms=40_000, p0=(500, None), p1=(200, 0))
    assert after.combined(IDLE_MS) == 500
    assert after.floors([P0], after.holding({}, IDLE_MS)) == {P0: None}
    assert after.combined(None) == 200  # no timeout: an idle partition always holds


def test_with_no_idle_timeout_only_partitions_left_with_unread_data_hold_the_next_watermark():
    state = progress(p0=(500, None), p1=(200, None), p2=(None, None))
    holding = state.holding({P0: False, P1: True, P2: False}, 0)  # only p1 keeps a backlog after the batch
    assert holding == [P1]
    assert state.floors([P0, P1, P2], holding) == {P0: 200, P1: None, P2: 200}
    # Everything read: nothing holds the watermark back, it follows the largest event time read.
    assert state.floors([P0, P1], state.holding({}, 0)) == {P0: None, P1: None}


def test_planned_floors_travel_with_the_offsets():
    state = progress(p0=(500, None), p1=(200, None))
    recorded = state.floors_json({P0: 200, P1: None})
    assert planned_floors(recorded) == {P0: 200, P1: None}
    assert Progress.from_json(recorded) == state
    assert planned_floors(None) == {}


def test_advanced_merges_reported_maxima_and_tracks_idleness():
    state = progress(at_ms=0, p0=(500, None), p1=(200, None))
    later = state.advanced({P0: 400, P1: 300, P2: 50}, {P0: True, P1: False, P2: True}, now_ms=5_000)
    assert later.partitions[P0] == PartitionProgress(500, None)  # never goes back
    assert later.partitions[P1] == PartitionProgress(300, 5_000)  # no unread data since now
    assert later.partitions[P2] == PartitionProgress(50, None)
    again = later.advanced({}, {P0: True, P1: False, P2: True}, now_ms=9_000)
    assert again.partitions[P1].idle_since_ms == 5_000  # idle since the first time it was seen idle
    back = again.advanced({}, {P1: True}, now_ms=9_500)
    assert back.partitions[P1].idle_since_ms is None


def test_progress_round_trips_through_the_offset_json():
    state = progress(at_ms=77, p0=(500, None), p1=(None, 3))
    offset = {"t": {"0": 10, "1": 4}, PROGRESS_KEY: state.to_json()}
    assert Progress.from_json(offset[PROGRESS_KEY]) == state
    assert from_map(offset) == {P0: 10, P1: 4}  # the progress is not taken for a topic


def test_admission_reads_the_partition_behind_in_event_time_first():
    state = progress(p0=(10_000, None), p1=(1_000, None))
    end = aligned_shares({P0: 0, P1: 0}, {P0: 500, P1: 500}, 100, state, slack_ms=2_000)
    assert end == {P0: 0, P1: 100}
    # Once the partition behind has nothing left, the budget goes to the one ahead.
    end = aligned_shares({P0: 0, P1: 500}, {P0: 500, P1: 500}, 100, state, slack_ms=2_000)
    assert end == {P0: 100, P1: 500}


def test_admission_without_progress_is_proportional_to_backlog():
    end = aligned_shares({P0: 0, P1: 0}, {P0: 300, P1: 100}, 100, Progress(), slack_ms=0)
    assert end == {P0: 75, P1: 25}


@given(
    st.dictionaries(st.sampled_from([P0, P1, P2]), st.tuples(st.integers(0, 50), st.integers(0, 500)), min_size=1),
    st.integers(1, 200),
    st.dictionaries(st.sampled_from([P0, P1, P2]), st.integers(0, 10_000)),
)
def test_admission_never_exceeds_the_budget_nor_the_backlog(parts, max_rows, maxima):
    start = {tp: s for tp, (s, _) in parts.items()}
    available = {tp: s + n for tp, (s, n) in parts.items()}
    state = Progress({tp: PartitionProgress(ms, None) for tp, ms in maxima.items()})
    end = aligned_shares(start, available, max_rows, state, slack_ms=100)
    assert all(start[tp] <= end[tp] <= available[tp] for tp in parts)
    admitted = sum(end[tp] - start[tp] for tp in parts)
    backlog = sum(available[tp] - start[tp] for tp in parts)
    assert admitted == min(max_rows, backlog)


def test_progress_file_keeps_the_largest_event_time(tmp_path):
    file = ProgressFile(str(tmp_path / "cp" / "progress.json"))
    assert file.read() == {}
    file.merge({P0: 100, P1: 50})
    file.merge({P0: 90, P2: 7})
    assert file.read() == {P0: 100, P1: 50, P2: 7}


def _records(floor: int | None, times: list[int]) -> tuple[int | None, pa.RecordBatch]:
    n = len(times)
    changes = pa.RecordBatch.from_pydict({
        "topic": ["t"] * n, "partition": pa.array([1] * n, pa.int32()),
        "timestamp": pa.array(times, pa.int64()), "event_time": pa.array([None] * n, pa.int64()),
        "error": pa.array([None] * n, pa.string()),
    })
    return floor, changes


def test_a_row_candidate_never_passes_the_other_partitions_floor():
    watermark = PartitionWatermark()
    candidates = watermark.candidates(*_records(floor=150, times=[100, 120, 110, 300]))
    assert candidates.to_pylist() == [100, 120, 120, 150]
    assert watermark.maxima == {P1: 300}
    alone = PartitionWatermark().candidates(*_records(floor=None, times=[100, 300]))
    assert alone.to_pylist() == [100, 300]


def test_per_partition_watermark_holds_compaction_back_while_one_partition_lags():
    """Partition 0 is read far ahead (event time 200 s) while partition 1 lags at 10 s with more to read:
    the watermark offered to compaction stays at partition 1's progress minus the delay, not 200 s minus it,
    so partition 1's changes between 10 s and 200 s are not late when they are read."""
    delay_ms = 5_000
    state = Progress({P0: PartitionProgress(None, None), P1: PartitionProgress(None, None)}, 0)
    state = state.advanced({P0: 200_000, P1: 10_000}, {P0: True, P1: True}, now_ms=1_000)
    floors = state.floors([P0, P1], state.holding({P0: True, P1: True}, 0))
    p0 = PartitionWatermark().candidates(*_records(floors[P0], [200_000, 201_000]))
    p1 = PartitionWatermark().candidates(*_records(floors[P1], [10_500, 11_000]))
    spark_watermark = max(p0.to_pylist() + p1.to_pylist()) - delay_ms
    assert spark_watermark == 11_000 - delay_ms
    assert spark_watermark < 200_000 - delay_ms  # what a global watermark would have said
