"""The next batch's rows read ahead: handed over only for exactly the range read."""

from __future__ import annotations

import threading
import time

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


def _runs_of(rows: pa.Table, seen: list, gate: threading.Event | None = None):
    """Runs of one record per row; `seen` records each run as it is encoded; `gate` holds back each run after the first."""
    for index, value in enumerate(rows.column("range").to_pylist() * 6):
        if gate is not None and index:
            assert gate.wait(60)
        seen.append(index)
        yield [f"{value}#{index}"]


def test_the_first_runs_are_encoded_only_after_go_and_handed_over_with_the_rest():
    seen: list = []
    read = threading.Event()
    ahead = ReadAhead(lambda begin: (4, 0), lambda b, e: read.set() or _rows(b, e), "t",
                      encode=lambda rows: _runs_of(rows, seen), runs=4)
    ahead.start((3, 0))
    assert read.wait(60)
    assert seen == []  # this batch's records are not all encoded yet: nothing of the next is
    ahead.go()
    _until(lambda: len(seen) >= 4)  # the thread encodes at most `runs` runs ahead
    taken = ahead.take((3, 0), (4, 0))
    assert [run[0] for run in taken.encoded.runs] == [f"(3, 0)-(4, 0)#{i}" for i in range(4)]
    assert [run[0] for run in taken.encoded.rest] == [f"(3, 0)-(4, 0)#{i}" for i in (4, 5)]
    assert seen == list(range(6))  # no run encoded twice, none skipped
    ahead.close()


def test_a_start_without_bound_encodes_until_taken():
    """The first batch of a new query is encoded while Spark starts: every run, not only `runs`."""
    seen: list = []
    ahead = ReadAhead(lambda begin: (begin[0] + 1, 0), _rows, "t", encode=lambda rows: _runs_of(rows, seen), runs=2)
    ahead.start((3, 0), bound=False)
    ahead.go()
    _until(lambda: len(seen) == 6)
    taken = ahead.take((3, 0), (4, 0))
    assert [run[0] for run in taken.encoded.runs] == [f"(3, 0)-(4, 0)#{i}" for i in range(6)]
    assert list(taken.encoded.rest) == []
    seen.clear()
    ahead.start((4, 0))  # the next start is bound again
    ahead.go()
    pending = ahead._pending
    _until(pending.done)  # bound: the thread ends after two runs (unbound, after six)
    taken = ahead.take((4, 0), (5, 0))
    assert [run[0] for run in taken.encoded.runs] == ["(4, 0)-(5, 0)#0", "(4, 0)-(5, 0)#1"] and seen == [0, 1]
    ahead.close()


def test_take_stops_the_encoding_after_the_run_under_way():
    seen: list = []
    gate = threading.Event()
    ahead = ReadAhead(lambda begin: (4, 0), _rows, "t", encode=lambda rows: _runs_of(rows, seen, gate), runs=4)
    ahead.start((3, 0))
    ahead.go()
    _until(lambda: len(seen) >= 1)  # the first run is encoded; the second waits for the gate
    threading.Timer(0.5, gate.set).start()  # opens after take began
    taken = ahead.take((3, 0), (4, 0))
    assert len(taken.encoded.runs) in (1, 2)  # the first run, and the one under way when take began
    rest = [run[0] for run in taken.encoded.rest]
    assert [run[0] for run in taken.encoded.runs] + rest == [f"(3, 0)-(4, 0)#{i}" for i in range(6)]
    ahead.close()


def test_nothing_is_encoded_when_take_comes_first_or_the_encoding_fails():
    seen: list = []
    ahead = ReadAhead(lambda begin: (4, 0), _rows, "t", encode=lambda rows: _runs_of(rows, seen), runs=4)
    ahead.start((3, 0))
    taken = ahead.take((3, 0), (4, 0))  # no go: this batch's records were never all encoded
    assert taken.rows.num_rows == 1 and taken.encoded is None and seen == []

    def failing(rows):
        yield ["first"]
        raise ValueError("no JSON form")

    ahead = ReadAhead(lambda begin: (4, 0), _rows, "t", encode=failing, runs=4)
    ahead.start((3, 0))
    ahead.go()
    taken = ahead.take((3, 0), (4, 0))
    assert taken.rows.num_rows == 1 and taken.encoded is None  # the batch encodes its rows itself
    ahead.close()


def _until(condition) -> None:
    deadline = time.monotonic() + 60
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_runs_encoded_ahead_and_not_used_are_undone():
    """Only runs encoded ahead and then not used are undone (the encoder's state goes back to empty)."""
    undone: list = []
    for how in ("used", "other range", "dropped", "failed", "encoder holds state"):
        seen: list = []
        called = threading.Event()

        def failing(rows):
            yield ["a"]
            raise ValueError("no JSON form")

        def encode(rows, seen=seen, how=how, called=called):
            called.set()
            if how == "encoder holds state":
                return None
            return failing(rows) if how == "failed" else _runs_of(rows, seen)

        ahead = ReadAhead(lambda begin: (4, 0), _rows, "t", encode=encode, undo=lambda how=how: undone.append(how),
                          runs=2)
        ahead.start((3, 0))
        ahead.go()
        _until(lambda: len(seen) == 2 or how in undone or (how == "encoder holds state" and called.is_set()))
        if how == "dropped":
            ahead.drop()
        else:
            taken = ahead.take((3, 0), (4, 0) if how != "other range" else (3, 5))
            assert (taken is not None and taken.encoded is not None) == (how == "used")
        ahead.close()
    assert undone == ["other range", "dropped", "failed"]
