"""FROM_CHANGELOG, stateful part: the previous image per key (spec 4.1.2.2.2, 4.3.3, 4.4).

Rows are dicts keyed by `CHANGELOG_SCHEMA` column names, all of one partition key, in source
order (or event-time order after `event_time_order`). The state of a key is a string (the
pipeline keeps it in Spark ValueState): the last live image with its keys, and when it
expires. Rules, dispatched on the row's `intent`, else its kind:
- upsert:          +I when the key has no live image, else +U.
- upsert_retract:  +I when the key has no live image, else -U(previous image) +U(new).
- update_retract:  -U(previous image) +U(new); +I when the image expired (spec 4.3.3).
- +I, +U:          emitted as they are; the new image is kept.
- -U:              emitted as it is (its +U follows and replaces the image).
- -D:              emitted as it is (deletes pass through, partial or full); the state is cleared.
Columns a row lists as `unchanged` are filled from the previous image when it holds them.
TTL is processing time since the key's last access; 0 keeps images forever (spec 4.3.3).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from service.kafka_to_delta.changelog.from_changelog import Intent, Marker
from service.kafka_to_delta.formats.debezium_json import compact_json, loads
from service.kafka_to_delta.rows.names import Column
from vocabulary.changes import ChangeKind

_ROW, _KEY, _UPSERT_KEY, _EXPIRES = "row", "key", "upsert_key", "expires_at_ms"
_MS_PER_S = 1000


@dataclass(frozen=True)
class UnzipStep:
    """Rows to emit, and the key's new state (None: clear it)."""

    rows: list[dict[str, Any]]
    state: str | None


class UpsertUnzip:
    """Turns upserts into +I / -U / +U with the previous image per key (pure; state as text)."""

    def __init__(self, ttl_seconds: float, clock: Callable[[], float] = time.time) -> None:
        self.ttl_ms = int(ttl_seconds * _MS_PER_S)
        self._clock = clock

    def _now_ms(self) -> int:
        return int(self._clock() * _MS_PER_S)

    def previous(self, state: str | None) -> dict[str, Any] | None:
        """The live previous image record of a state (row text, key, upsert_key), None when expired."""
        if state is None:
            return None
        previous = orjson.loads(state)
        expires = previous.get(_EXPIRES)
        if expires is not None and self._now_ms() >= expires:
            return None
        return previous

    def expires_at_ms(self, state: str | None) -> int | None:
        """When a state expires (for a processing-time timer that clears it); None: never."""
        return None if state is None else orjson.loads(state).get(_EXPIRES)

    def apply(self, state: str | None, rows: Iterable[Mapping[str, Any]]) -> UnzipStep:
        """Process one key's rows in order; returns the rows to emit and the new state."""
        previous = self.previous(state)
        out: list[dict[str, Any]] = []
        for row in rows:
            emitted, previous = self._one(dict(row), previous)
            out.extend(emitted)
        return UnzipStep(out, self._state(previous))

    def _state(self, previous: dict[str, Any] | None) -> str | None:
        if previous is None:
            return None
        expires = None if self.ttl_ms == 0 else self._now_ms() + self.ttl_ms
        return orjson.dumps({**previous, _EXPIRES: expires}).decode()

    def _one(self, change: dict, previous: dict | None) -> tuple[list[dict], dict | None]:
        kind, intent = change[Column.KIND], change.get(Column.INTENT)
        if kind == Marker.TRUNCATE.value or kind == ChangeKind.DELETE.value:
            return [change], None
        if kind == ChangeKind.UPDATE_BEFORE.value:
            return [change], previous
        change = _filled(change, previous)
        image = {_ROW: change[Column.ROW], _KEY: change[Column.KEY], _UPSERT_KEY: change[Column.UPSERT_KEY]}
        if intent is None:
            return [change], image
        change[Column.INTENT] = None
        if previous is None:
            return [{**change, Column.KIND: ChangeKind.INSERT.value}], image
        after = {**change, Column.KIND: ChangeKind.UPDATE_AFTER.value}
        if Intent(intent) is Intent.UPSERT:
            return [after], image
        return [_before(change, previous), after], image


def _before(change: dict, previous: dict) -> dict:
    """The -U row of the previous image, carrying the new row's source coordinates."""
    return {
        **change,
        Column.KIND: ChangeKind.UPDATE_BEFORE.value,
        Column.ROW: previous[_ROW],
        Column.KEY: previous[_KEY],
        Column.UPSERT_KEY: previous[_UPSERT_KEY],
        Column.UNCHANGED: None,
    }


def _filled(change: dict, previous: dict | None) -> dict:
    """The row with its `unchanged` columns taken from the previous image where it has them."""
    unchanged = change.get(Column.UNCHANGED)
    if not unchanged or previous is None:
        return change
    columns = loads(unchanged.encode())
    stored = loads(previous[_ROW].encode())
    row = loads(change[Column.ROW].encode())
    row.update({column: stored[column] for column in columns if column in stored})
    left = [column for column in columns if column not in stored]
    return {**change, Column.ROW: compact_json(row), Column.UNCHANGED: compact_json(left) if left else None}
