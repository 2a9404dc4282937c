"""FROM_CHANGELOG ORDER BY event time (spec 4.1.2.2.1, 4.1.2.2.3, 4.3.2).

The watermark is the largest event time seen minus the delay. A row is late when its event
time is below the watermark: it is dropped and counted, or returned for the dead-letter store
(`late_handling`). Other rows are buffered per partition key and released, in event-time
order (arrival order among equal times), once the watermark reaches their event time. A
released window is then compacted per key to its net effect (`compact`), so intermediate
versions inside one window never reach the table.

Rows are dicts keyed by `CHANGELOG_SCHEMA` column names with `event_time` set (epoch ms).
`EventTimeBuffer` is the per-key part whose state is a string (Spark ValueState, with the
engine's watermark and an event-time timer at `next_release`); `EventTimeOrder` runs the
whole stream in one process with its own watermark (the reference the tests follow).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from service.config.from_changelog import LateHandling
from service.kafka_to_delta.barrier import released
from service.kafka_to_delta.rows.names import Column
from vocabulary.changes import ChangeKind

LATE_REASON = "late record: event time {behind} ms behind the watermark"
_MS_PER_S = 1000
_INSERT, _UPDATE_BEFORE, _UPDATE_AFTER, _DELETE = (k.value for k in ChangeKind)
_RETRACTIONS = (_UPDATE_BEFORE, _DELETE)


@dataclass
class BufferStep:
    """Released rows (event-time order), late rows returned for dead-lettering, late rows dropped,
    and the key's new state (None: nothing buffered)."""

    released: list[dict[str, Any]] = field(default_factory=list)
    late: list[dict[str, Any]] = field(default_factory=list)
    dropped: int = 0
    state: str | None = None


def _event_time(row: Mapping[str, Any]) -> int:
    return int(row[Column.EVENT_TIME])  # pandas may hand integers over as floats


class EventTimeBuffer:
    """Buffers one partition key's rows until the watermark passes them (pure; state as text)."""

    def __init__(self, late_handling: LateHandling = "drop") -> None:
        self.late_handling = late_handling

    def add(self, state: str | None, rows: Iterable[Mapping[str, Any]], watermark_ms: int | None) -> BufferStep:
        """Buffer `rows` (late ones aside) and release what `watermark_ms` has passed."""
        buffered = [] if state is None else orjson.loads(state)
        step = BufferStep()
        for row in rows:
            behind = None if watermark_ms is None else watermark_ms - _event_time(row)
            if behind is None or behind <= 0:
                buffered.append(dict(row))
            elif self.late_handling == "drop":
                step.dropped += 1
            else:
                reason = LATE_REASON.format(behind=behind)
                error = {Column.ERROR: reason, Column.HANDLING: "DEAD_LETTER", Column.STAGE: "from_changelog"}
                step.late.append({**row, **error})
        step.released, step.state = _release(buffered, watermark_ms)
        return step

    def release(self, state: str | None, watermark_ms: int | None) -> BufferStep:
        """Release what the watermark has passed (an event-time timer fired)."""
        return self.add(state, (), watermark_ms)

    @staticmethod
    def next_release(state: str | None) -> int | None:
        """The earliest buffered event time: when the watermark reaches it, call `release`."""
        if state is None:
            return None
        return min(_event_time(row) for row in orjson.loads(state))


def _release(buffered: list[dict], watermark_ms: int | None) -> tuple[list[dict], str | None]:
    ready: list[dict]
    kept: list[dict]
    if watermark_ms is None:
        ready, kept = [], buffered
    else:
        ready, kept = released(buffered, watermark_ms, _event_time)
    ready.sort(key=_event_time)  # stable: arrival order among equal event times
    return ready, (orjson.dumps(kept).decode() if kept else None)


def compact(rows: Iterable[Mapping[str, Any]], key_column: str = Column.UPSERT_KEY) -> list[dict[str, Any]]:
    """Net effect per key of a released window (spec 4.1.2.2.3), in the order of each key's last row.

    Before the window a key existed when its first row is a retraction (-U, -D: its image is
    known) or +U (image unknown); after it, when its last row is +I or +U. Absent -> present:
    +I(last); present -> present: -U(first) +U(last), or +U(last) when the first image is
    unknown; present -> absent: -D(first retracted image, else last); absent -> absent: nothing.
    Rows whose kind the stateful stage still has to decide (`intent`) are left as they are.
    """
    groups: dict[Any, list[dict]] = {}
    last_index: dict[Any, int] = {}
    for index, row in enumerate(rows):
        groups.setdefault(row[key_column], []).append(dict(row))
        last_index[row[key_column]] = index
    return [row for key in sorted(groups, key=last_index.__getitem__) for row in _net(groups[key])]


def _net(group: list[dict]) -> list[dict]:
    if len(group) == 1 or any(row.get(Column.INTENT) for row in group):
        return group
    first, last = group[0], group[-1]
    existed = first[Column.KIND] != _INSERT
    known = first if first[Column.KIND] in _RETRACTIONS else None
    exists = last[Column.KIND] in (_INSERT, _UPDATE_AFTER)
    if exists and not existed:
        return [{**last, Column.KIND: _INSERT}]
    if exists:
        after = {**last, Column.KIND: _UPDATE_AFTER}
        return [{**known, Column.KIND: _UPDATE_BEFORE}, after] if known else [after]
    if existed:
        return [{**(known or last), Column.KIND: _DELETE}]
    return []


class Watermark:
    """The largest event time seen minus the delay (None until a row was seen)."""

    def __init__(self, delay_seconds: float, current_ms: int | None = None) -> None:
        self.delay_ms = int(delay_seconds * _MS_PER_S)
        self.current_ms = current_ms

    def observe(self, event_time_ms: int) -> None:
        """Advance with one row's event time; a watermark never goes back."""
        candidate = event_time_ms - self.delay_ms
        if self.current_ms is None or candidate > self.current_ms:
            self.current_ms = candidate


@dataclass
class OrderStep:
    """What one `EventTimeOrder.push` released (compacted), and its late rows."""

    released: list[dict[str, Any]]
    late: list[dict[str, Any]]
    dropped: int


class EventTimeOrder:
    """ORDER BY for a whole stream in one process: a watermark and one buffer per partition key."""

    def __init__(
        self, delay_seconds: float, late_handling: LateHandling = "drop", watermark_ms: int | None = None,
        compacted: bool = True,
    ) -> None:
        self.watermark = Watermark(delay_seconds, watermark_ms)
        self.buffer = EventTimeBuffer(late_handling)
        self.compacted = compacted
        self.states: dict[str, str] = {}

    def push(self, rows: Iterable[Mapping[str, Any]]) -> OrderStep:
        """Feed rows in arrival order; each is checked against the watermark as it stands when it
        arrives, then advances it. Returns what the resulting watermark releases."""
        late: list[dict] = []
        released: list[dict] = []
        dropped = 0
        for row in rows:
            key = row[Column.PARTITION_KEY]
            step = self.buffer.add(self.states.get(key), [row], self.watermark.current_ms)
            self._keep(key, step.state)
            released.extend(step.released)
            late.extend(step.late)
            dropped += step.dropped
            self.watermark.observe(_event_time(row))
        for key in list(self.states):
            step = self.buffer.release(self.states[key], self.watermark.current_ms)
            self._keep(key, step.state)
            released.extend(step.released)
        released.sort(key=_event_time)
        return OrderStep(compact(released) if self.compacted else released, late, dropped)

    def _keep(self, key: str, state: str | None) -> None:
        if state is None:
            self.states.pop(key, None)
        else:
            self.states[key] = state
