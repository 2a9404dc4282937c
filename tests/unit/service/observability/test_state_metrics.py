"""State store figures from a streaming query's progress."""

from __future__ import annotations

from service.observability import metrics


def test_state_rows_and_bytes_are_summed_over_stateful_operators():
    progress = {"stateOperators": [{"numRowsTotal": 3, "memoryUsedBytes": 100},
                                   {"numRowsTotal": 4, "memoryUsedBytes": 50}]}
    metrics.record_state("state-test", progress)
    assert metrics.STATE_ROWS.labels("state-test")._value.get() == 7
    assert metrics.STATE_BYTES.labels("state-test")._value.get() == 150
    metrics.record_state("state-test", None)  # before the first progress: unchanged, no error
    assert metrics.STATE_ROWS.labels("state-test")._value.get() == 7
