"""The export's read keeps a batch's rows in (version, `_commit_row`) order without copying when they are already."""

from __future__ import annotations

import pyarrow as pa

from connectors.delta.feed_chunks import COMMIT_ROW
from service.delta_to_kafka.pipeline import after_position, sort_feed


def _feed(places: list[tuple[int, int]]) -> pa.Table:
    return pa.table({"_commit_version": pa.array([v for v, _ in places], pa.int64()),
                     COMMIT_ROW: pa.array([r for _, r in places], pa.int64()),
                     "n": list(range(len(places)))})


def test_a_feed_in_order_is_kept_as_it_is():
    feed = _feed([(1, 0), (1, 1), (2, 0), (2, 1), (2, 2), (3, 0)])
    assert sort_feed(feed) is feed
    assert after_position(feed, (1, 0)) is feed


def test_a_feed_out_of_order_is_sorted_stably():
    places = [(2, 0), (1, 1), (1, 0), (2, 0), (1, 1), (0, 5)]
    ordered = sort_feed(_feed(places))
    expected = sorted(range(len(places)), key=lambda i: places[i])  # sorted() is stable
    assert ordered.column("n").to_pylist() == expected
    versions_only = sort_feed(_feed(places).drop_columns([COMMIT_ROW]))
    assert versions_only.column("n").to_pylist() == sorted(range(len(places)), key=lambda i: places[i][0])


def test_rows_before_the_position_are_dropped():
    feed = _feed([(1, 0), (1, 1), (2, 0), (2, 1)])
    assert after_position(feed, (1, 1)).column("n").to_pylist() == [1, 2, 3]
    assert after_position(feed, (2, 0)).column("n").to_pylist() == [2, 3]
