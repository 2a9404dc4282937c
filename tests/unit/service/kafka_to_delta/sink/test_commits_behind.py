"""Commits behind the micro-batches: the changes written ahead survive a stop, are replayed in batch
order, and a failed commit is raised to the next hand-over and kept for the runner."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from service.kafka_to_delta.sink.commits_behind import (
    CommitsBehind,
    WrittenAhead,
    replay,
    write_ahead,
    written_ahead,
)


def _changes(batch_id: int) -> pa.Table:
    return pa.table({"id": pa.array([batch_id, batch_id + 100], pa.int64()), "name": ["a", None]},
                    metadata={b"kept": b"yes"})


def test_a_batch_written_ahead_reads_back_whole(tmp_path):
    ahead = WrittenAhead(7, "cdc-lakehouse/p/t/q", _changes(7), truncate=True)
    path = write_ahead(tmp_path / "ahead", ahead)
    assert path.name == "7.arrow"
    (back,) = written_ahead(tmp_path / "ahead")
    assert (back.batch_id, back.app_id, back.truncate) == (7, "cdc-lakehouse/p/t/q", True)
    assert back.changes.equals(ahead.changes)
    assert back.changes.schema.metadata == {b"kept": b"yes"}


def test_a_batch_written_ahead_unjoined_reads_back_with_its_truncates(tmp_path):
    truncates = (("db.public.t", 0, 41), ("db.public.t", 3, 7))
    write_ahead(tmp_path / "ahead", WrittenAhead(4, "app", _changes(4), truncate=True, unjoined=truncates))
    write_ahead(tmp_path / "ahead", WrittenAhead(5, "app", _changes(5), truncate=False, unjoined=()))
    write_ahead(tmp_path / "ahead", WrittenAhead(6, "app", _changes(6), truncate=False))
    back = list(written_ahead(tmp_path / "ahead"))
    assert [(a.batch_id, a.unjoined) for a in back] == [(4, truncates), (5, ()), (6, None)]
    assert all(a.changes.schema.metadata == {b"kept": b"yes"} for a in back)


def test_replay_commits_in_batch_order_and_removes_the_files(tmp_path):
    folder = tmp_path / "ahead"
    for batch_id in (10, 9, 2):
        write_ahead(folder, WrittenAhead(batch_id, "app", _changes(batch_id), truncate=False))
    (folder / ".11.arrow.tmp").write_bytes(b"a write that never finished")
    committed = []
    assert replay(folder, "p", lambda ahead: committed.append((ahead.batch_id, ahead.changes.column("id")[0].as_py()))) == 3
    assert committed == [(2, 2), (9, 9), (10, 10)]
    assert list(folder.iterdir()) == []


def test_a_failed_replay_keeps_the_batch_written_ahead(tmp_path):
    folder = tmp_path / "ahead"
    write_ahead(folder, WrittenAhead(3, "app", _changes(3), truncate=False))

    def fails(ahead):
        raise RuntimeError("table unreachable")

    with pytest.raises(RuntimeError, match="unreachable"):
        replay(folder, "p", fails)
    assert [a.batch_id for a in written_ahead(folder)] == [3]


def test_commits_run_behind_in_order_and_remove_their_files(tmp_path):
    folder = tmp_path / "ahead"
    failures = []
    commits = CommitsBehind(folder, "p", failures.append)
    release, order = threading.Event(), []

    def first():
        assert (folder / "1.arrow").exists()  # written ahead before the commit runs
        release.wait(30)
        order.append(1)

    commits.hand_over(WrittenAhead(1, "app", _changes(1), False), first)
    assert order == []  # the hand-over returned with the commit still running
    release.set()
    commits.hand_over(WrittenAhead(2, "app", _changes(2), False), lambda: order.append(2))
    assert order == [1]  # the second was handed over only after the first ended
    commits.wait()
    assert order == [1, 2] and failures == []
    assert list(folder.iterdir()) == []


def test_a_failed_commit_is_raised_at_the_next_hand_over_and_kept(tmp_path):
    folder = tmp_path / "ahead"
    failures = []
    commits = CommitsBehind(folder, "p", failures.append)

    def fails():
        raise ValueError("schema change refused")

    commits.hand_over(WrittenAhead(4, "app", _changes(4), False), fails)
    with pytest.raises(ValueError, match="refused"):
        commits.hand_over(WrittenAhead(5, "app", _changes(5), False), lambda: None)
    assert [str(f) for f in failures] == ["schema change refused"]
    assert [a.batch_id for a in written_ahead(folder)] == [4]  # left for the next start's replay
    assert commits.settle() is None  # raised once


def test_settle_returns_the_failure(tmp_path):
    commits = CommitsBehind(tmp_path / "ahead", "p", lambda error: None)

    def fails():
        raise OSError("disk full")

    commits.hand_over(WrittenAhead(1, "app", _changes(1), False), fails)
    assert isinstance(commits.settle(), OSError)


def test_close_waits_for_the_commit_in_flight_and_ends_the_thread(tmp_path):
    commits = CommitsBehind(tmp_path / "ahead", "p", lambda error: None)
    done = []
    commits.hand_over(WrittenAhead(1, "app", _changes(1), False), lambda: done.append(1))
    commits.close()
    assert done == [1] and list((tmp_path / "ahead").iterdir()) == []
    with pytest.raises(RuntimeError, match="shutdown"):
        commits.hand_over(WrittenAhead(2, "app", _changes(2), False), lambda: None)
