"""ORDER BY event time (spec 4.1.2.2.1, 4.1.2.2.3): buffer, watermark, late rows, compaction."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.kafka_to_delta.changelog.event_time_order import (
    EventTimeBuffer,
    EventTimeOrder,
    Watermark,
    compact,
)


def row(kind: str, ident: int, v: str, at: int, offset: int = 0, intent: str | None = None) -> dict:
    return {
        "topic": "t", "partition": 0, "offset": offset, "change_index": 0, "kind": kind,
        "key": f"[{ident}]", "upsert_key": f"[{ident}]", "partition_key": f"[{ident}]",
        "row": json.dumps({"id": ident, "v": v}), "event_time": at, "intent": intent,
    }


def shown(rows: list[dict]) -> list[tuple]:
    return [(r["kind"], json.loads(r["row"])["id"], json.loads(r["row"])["v"]) for r in rows]


def test_watermark_is_the_largest_event_time_minus_the_delay_and_never_goes_back():
    watermark = Watermark(delay_seconds=5)
    assert watermark.current_ms is None
    watermark.observe(10_000)
    watermark.observe(7_000)
    assert watermark.current_ms == 5_000
    watermark.observe(12_000)
    assert watermark.current_ms == 7_000


def test_buffer_releases_in_event_time_order_and_keeps_the_rest():
    buffer = EventTimeBuffer()
    rows = [row("+I", 1, "c", 30), row("+U", 1, "a", 10), row("+U", 1, "b", 10), row("+U", 1, "d", 40)]
    step = buffer.add(None, rows, watermark_ms=None)
    assert step.released == [] and step.dropped == 0
    assert EventTimeBuffer.next_release(step.state) == 10
    step = buffer.release(step.state, watermark_ms=30)
    assert [r["offset"] for r in step.released] == [0, 0, 0]
    assert shown(step.released) == [("+U", 1, "a"), ("+U", 1, "b"), ("+I", 1, "c")]  # equal times: arrival order
    assert EventTimeBuffer.next_release(step.state) == 40
    assert buffer.release(step.state, watermark_ms=40).state is None


def test_late_rows_are_dropped_or_returned():
    rows = [row("+I", 1, "late", 9), row("+I", 1, "on time", 10)]
    dropped = EventTimeBuffer("drop").add(None, rows, watermark_ms=10)
    assert dropped.dropped == 1 and shown(dropped.released) == [("+I", 1, "on time")] and dropped.late == []
    returned = EventTimeBuffer("dead_letter").add(None, rows, watermark_ms=10)
    assert returned.dropped == 0 and [r["error"] for r in returned.late] == [
        "late record: event time 1 ms behind the watermark"
    ]
    assert returned.late[0]["handling"] == "DEAD_LETTER" and returned.late[0]["stage"] == "from_changelog"


def test_event_times_from_pandas_floats_are_accepted():
    step = EventTimeBuffer().add(None, [{**row("+I", 1, "a", 0), "event_time": 10.0}], watermark_ms=10)
    assert len(step.released) == 1


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        (["+I", "+U", "+U"], [("+I", "3")]),  # absent -> present
        (["+I", "+U", "-D"], []),  # absent -> absent
        (["-U", "+U", "-U", "+U"], [("-U", "1"), ("+U", "4")]),  # present (known image) -> present
        (["+U", "+U"], [("+U", "2")]),  # present (unknown image) -> present
        (["-U", "+U", "-D"], [("-D", "1")]),  # present -> absent: the image before the window
        (["+U", "-D"], [("-D", "2")]),
        (["-D", "+I"], [("-U", "1"), ("+U", "2")]),
        (["-D", "+I", "-D"], [("-D", "1")]),
        (["+U"], [("+U", "1")]),
    ],
)
def test_compaction_keeps_the_net_effect_per_key(kinds, expected):
    rows = [row(kind, 5, str(number), number) for number, kind in enumerate(kinds, start=1)]
    assert [(kind, v) for kind, _, v in shown(compact(rows))] == expected


def test_compaction_orders_keys_by_their_last_row_and_leaves_undecided_rows():
    rows = [row("+I", 1, "a", 1), row("+I", 2, "b", 2), row("+U", 1, "c", 3),
            row("+U", 3, "x", 4, intent="upsert"), row("+U", 3, "y", 5, intent="upsert")]
    assert shown(compact(rows)) == [("+I", 2, "b"), ("+I", 1, "c"), ("+U", 3, "x"), ("+U", 3, "y")]


def test_stream_releases_across_keys_in_event_time_order():
    order = EventTimeOrder(delay_seconds=0.015, compacted=False)
    assert order.push([row("+I", 2, "b", 20), row("+I", 1, "a", 10)]).released == []
    step = order.push([row("+I", 3, "c", 40)])
    assert shown(step.released) == [("+I", 1, "a"), ("+I", 2, "b")]
    assert order.watermark.current_ms == 25 and list(order.states) == ["[3]"]


@settings(max_examples=300, deadline=None)
@given(times=st.lists(st.integers(0, 100), max_size=40), delay=st.integers(0, 30), batch=st.integers(1, 5))
def test_every_row_is_either_late_or_released_once_in_order(times, delay, batch):
    order = EventTimeOrder(delay_seconds=delay / 1000, late_handling="dead_letter", compacted=False)
    rows = [row("+I", i % 3, str(i), at, offset=i) for i, at in enumerate(times)]
    released, late, highest = [], [], None
    for start in range(0, len(rows), batch):
        for r in rows[start:start + batch]:
            if highest is not None and r["event_time"] < highest - delay:
                late.append(r["offset"])
            highest = r["event_time"] if highest is None else max(highest, r["event_time"])
        step = order.push(rows[start:start + batch])
        released += step.released
        assert [r["offset"] for r in step.late] == [o for o in late if o >= start]
        assert all(r["event_time"] <= order.watermark.current_ms for r in step.released)
    buffered = [r["offset"] for state in order.states.values() for r in json.loads(state)]
    assert sorted([r["offset"] for r in released] + late + buffered) == list(range(len(rows)))
    # released in event-time order within each push; pushes never go back in time
    assert [r["event_time"] for r in released] == sorted(r["event_time"] for r in released)
