"""The next batch's rows read ahead: handed over only for exactly the range read."""

from __future__ import annotations

import threading

import pyarrow as pa

from service.delta_to_kafka.read_ahead import ReadAhead


def _rows(begin, end) -> pa.Table:
    return pa.table({"range": [f"{begin}-{end}"]})


def test_the_rows_of_the_planned_range_are_handed_over_once():
    reads = []
    ahead = ReadAhead(lambda begin: (begin[0] + 1, 0), lambda b, e: reads.append((b, e)) or _rows(b, e), "t")
    ahead.start((3, 0))
    taken = ahead.take((3, 0), (4, 0))
    assert taken.rows.column("range").to_pylist() == ["(3, 0)-(4, 0)"] and taken.encoded is None
    assert ahead.take((3, 0), (4, 0)) is None  # handed over once
    assert reads == [((3, 0), (4, 0))] and ahead.used == 1
    ahead.close()


def test_another_range_nothing_to_read_or_a_failed_read_give_nothing():
    ahead = ReadAhead(lambda begin: (begin[0], 7), _rows, "t")
    ahead.start((3, 0))
    assert ahead.take((3, 0), (3, 5)) is None  # Spark ended the batch elsewhere
    ahead = ReadAhead(lambda begin: None, _rows, "t")
    ahead.start((3, 0))
    assert ahead.take((3, 0), (4, 0)) is None
    ahead = ReadAhead(lambda begin: (4, 0), lambda b, e: 1 / 0, "t")
    ahead.start((3, 0))
    assert ahead.take((3, 0), (4, 0)) is None and ahead.used == 0
    ahead.close()


def test_take_waits_for_a_read_under_way():
    """A read ahead shares the pipeline's reader state: the batch reads only after it ended."""
    release = threading.Event()

    def slow(begin, end):
        assert release.wait(60)
        return _rows(begin, end)

    ahead = ReadAhead(lambda begin: (4, 0), slow, "t")
    ahead.start((3, 0))
    threading.Timer(0.2, release.set).start()
    assert ahead.take((3, 0), (4, 1)) is None  # waited, then found another range
    assert release.is_set()
    ahead.close()
