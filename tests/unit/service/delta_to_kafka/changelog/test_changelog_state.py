"""TO_CHANGELOG state as keyed records: changes, tombstones, canonical keys, restore."""

from __future__ import annotations

import pickle
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest

from service.delta_to_kafka.changelog.changelog_state import (
    ChangelogState,
    StateRestoreError,
    key_bytes,
)

PK = ("id",)


def live(records: list[tuple[bytes, bytes | None]], into: dict | None = None) -> dict[bytes, bytes]:
    """What a compacted topic keeps of `records`: the last value per key, tombstones deleting."""
    topic = {} if into is None else into
    for key, value in records:
        if value is None:
            topic.pop(key, None)
        else:
            topic[key] = value
    return topic


def test_changes_are_one_record_per_touched_key_and_a_tombstone_when_it_holds_nothing():
    state = ChangelogState(0, PK)
    state.remember((1,), {"id": 1, "v": "a"}, 10.0)
    state.remember((2,), {"id": 2, "v": "b"}, 10.0)
    state.remember((1,), {"id": 1, "v": "c"}, 11.0)
    first = state.changes()
    assert [key for key, _ in first] == [key_bytes((1,)), key_bytes((2,))] and all(v for _, v in first)
    assert state.changes() == []  # nothing touched since
    state.remember((2,), None, 12.0)
    state.remember((9,), None, 12.0)  # forgetting an unknown key changes nothing
    state.put_pending((3,), {"id": 3, "v": "x"}, 12.0)
    state.put_pending((4,), {"id": 4, "v": "y"}, 12.0)
    assert state.take_pending((4,), 13.0) == {"id": 4, "v": "y"}
    second = state.changes()
    assert [(key, value is None) for key, value in second] == [
        (key_bytes((2,)), True), (key_bytes((3,)), False), (key_bytes((4,)), True)]
    topic = live(second, live(first))
    assert state.keys() == len(topic) == 2
    restored = ChangelogState.load(topic.values(), 0, PK)
    assert restored.previous((1,), 99.0) == {"id": 1, "v": "c"} and restored.previous((2,), 99.0) is None
    assert restored.take_pending((3,), 99.0) == {"id": 3, "v": "x"}
    assert restored.changes() == [(key_bytes((3,)), None)]  # loaded entries are not written again


def test_expired_entries_leave_tombstones_and_restored_entries_keep_their_clock():
    state = ChangelogState(60, PK)
    state.remember((1,), {"id": 1}, 0.0)
    state.remember((2,), {"id": 2}, 50.0)
    topic = live(state.changes())
    state.expire(100.0)
    assert state.changes() == [(key_bytes((1,)), None)]
    restored = ChangelogState.load(live([(key_bytes((1,)), None)], topic).values(), 60, PK)
    assert restored.keys() == 1 and restored.previous((2,), 110.0) == {"id": 2}
    assert restored.previous((2,), 111.0) is None  # touched at 50: the TTL counts from then, not from the load


def test_values_come_back_exactly_and_the_key_has_one_encoding_per_value():
    when = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
    image = {"id": Decimal("1.50"), "at": when.astimezone(ZoneInfo("Europe/Paris")), "raw": b"\x00\xff",
             "day": date(2024, 5, 1), "n": 2**63 - 1, "gap": timedelta(seconds=3)}
    state = ChangelogState(0, ("id", "at"))
    state.remember((Decimal("1.50"), when), image, 1.0)
    (restored_image,) = [ChangelogState.load([v], 0, ("id", "at")).previous((Decimal("1.50"), when), 2.0)
                         for _, v in state.changes()]
    assert restored_image == image and restored_image["at"].tzinfo == ZoneInfo("Europe/Paris")
    # The same instant in another zone, an equal string built apart: the same record key.
    assert key_bytes((when,)) == key_bytes((when.astimezone(ZoneInfo("Asia/Tokyo")),))
    assert key_bytes(("a" * 3,)) == key_bytes(("".join(["a", "aa"]),))
    assert len({key_bytes((1,)), key_bytes(("1",)), key_bytes((True,)), key_bytes((1.0,)), key_bytes((b"1",))}) == 5


def test_load_refuses_records_of_another_primary_key_or_that_are_not_plain_data():
    state = ChangelogState(0, PK)
    state.remember((1,), {"id": 1}, 0.0)
    (_, value), = state.changes()
    with pytest.raises(StateRestoreError, match=r"written for primary key \['id'\], not \['key'\]"):
        ChangelogState.load([value], 0, ("key",))
    with pytest.raises(StateRestoreError, match=r"refers to (os|posix)\.system, which is not plain data"):
        ChangelogState.load([pickle.dumps(__import__("os").system)], 0, PK)
    with pytest.raises(StateRestoreError, match="state record is corrupt"):
        ChangelogState.load([b"\x80\x05junk"], 0, PK)
    with pytest.raises(StateRestoreError, match="unknown format"):
        ChangelogState.load([pickle.dumps({"format": 1})], 0, PK)


def test_a_whole_snapshot_restores_with_every_key_marked_for_the_state_topic():
    state = ChangelogState(0, PK)
    state.remember((1,), {"id": 1}, 0.0)
    state.put_pending((2,), {"id": 2}, 0.0)
    restored = ChangelogState.restore(state.snapshot(), 0, PK)
    assert len(restored) == 2 and sorted(key for key, _ in restored.changes()) == [key_bytes((1,)), key_bytes((2,))]
