"""The shared event-time rules: the watermark's release and the TTL, reference and Arrow twin equal."""

from __future__ import annotations

from operator import itemgetter

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from service.kafka_to_delta.barrier import expires_at, outlived, outlived_mask, released

_TIMES = st.integers(min_value=-(2**40), max_value=2**40)


def test_the_watermark_releases_rows_at_or_behind_it_in_the_order_given() -> None:
    rows = [{"t": 5, "n": 0}, {"t": 9, "n": 1}, {"t": 3, "n": 2}, {"t": 5, "n": 3}, {"t": 6, "n": 4}]
    due, wait = released(rows, 5, itemgetter("t"))
    assert [r["n"] for r in due] == [0, 2, 3]
    assert [r["n"] for r in wait] == [1, 4]


def test_a_ttl_expires_at_touch_plus_ttl_and_zero_never_expires() -> None:
    assert not outlived(100, 10, 109)
    assert outlived(100, 10, 110)
    assert not outlived(100, 0, 10**12)
    assert not outlived(None, 10, 10**12)
    assert expires_at(100, 10) == 110
    assert expires_at(100, 0) is None
    assert expires_at(None, 10) is None


@settings(deadline=None)
@given(st.lists(st.one_of(st.none(), _TIMES), max_size=30), st.integers(min_value=0, max_value=2**30), _TIMES)
def test_the_arrow_twin_agrees_with_the_reference(touched: list[int | None], ttl_ms: int, now_ms: int) -> None:
    mask = outlived_mask(pa.array(touched, pa.int64()), ttl_ms, now_ms)
    assert mask.to_pylist() == [outlived(t, ttl_ms, now_ms) for t in touched]


def test_the_arrow_twin_takes_chunked_columns() -> None:
    column = pa.chunked_array([[1, None], [30]], pa.int64())
    assert outlived_mask(column, 10, 20).to_pylist() == [True, False, False]
    assert outlived_mask(column, 0, 20).to_pylist() == [False, False, False]
