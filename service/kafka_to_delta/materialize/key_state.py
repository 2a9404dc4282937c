"""State of one sink primary key in the materializer, and its text form (one JSON string per key).

The streaming adapter keeps the string in a value state keyed by the primary key; nothing here
knows about Spark. The text form is compact because the state is held for every live key:

    {"v": 1,
     "l": [{"k": upsert_key, "r": row, "p": [topic, partition, offset], "s": [...], "w": 1}, ...],
     "t": {upsert_key: [sequence, [topic, partition, offset], deleted_at_ms], ...}}

"s" (sequence) is left out when there is none, "w" marks a whole-row key (retract mode), and "k"
is left out for a whole-row key whose text equals the row text. "t" is left out when empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

KeyMode = Literal["upsert_key", "whole_row"]
"""How a change names its row: by the upsert-key values, or (retract mode) by the whole row."""

Position = tuple[str, int, int]
"""(topic, partition, offset) of the record a change came from."""

STATE_VERSION = 1


class StateFormatError(ValueError):
    """A stored state string cannot be read; the message never quotes the state."""


@dataclass(frozen=True)
class LiveRow:
    """A row that is live for this primary key: added and not (yet) retracted."""

    upsert_key: str
    row: str
    position: Position
    sequence: tuple | None = None
    key_mode: KeyMode = "upsert_key"


@dataclass(frozen=True)
class Tombstone:
    """The sequence of the last delete of an upsert key, kept so a late older add cannot resurrect it."""

    sequence: tuple
    position: Position
    deleted_at_ms: int


@dataclass
class PkState:
    """Everything remembered for one primary key.

    `rows` are the live rows in arrival order (the list index is the arrival order). Between two
    barriers the last live row is the row in the table under every on_conflict strategy, so the
    emitted row is not stored twice.
    """

    rows: list[LiveRow] = field(default_factory=list)
    tombstones: dict[str, Tombstone] = field(default_factory=dict)

    @property
    def emitted(self) -> str | None:
        """The row the table holds for this key after the previous barrier (None: no row)."""
        return self.rows[-1].row if self.rows else None

    @property
    def is_empty(self) -> bool:
        """True when there is nothing worth keeping."""
        return not self.rows and not self.tombstones


def _row_fields(upsert_key: str, row: str, position: Position, sequence: tuple | None = None,
                key_mode: KeyMode = "upsert_key") -> dict[str, Any]:
    out: dict[str, Any] = {"r": row, "p": position}
    if key_mode == "whole_row":
        out["w"] = 1
    if key_mode != "whole_row" or upsert_key != row:
        out["k"] = upsert_key
    if sequence is not None:
        out["s"] = sequence
    return out


def _encode_row(live: LiveRow) -> dict[str, Any]:
    return _row_fields(live.upsert_key, live.row, live.position, live.sequence, live.key_mode)


def encode_state(state: PkState) -> str | None:
    """The text form of `state`; None when there is nothing to keep."""
    if state.is_empty:
        return None
    out: dict[str, Any] = {"v": STATE_VERSION, "l": [_encode_row(live) for live in state.rows]}
    if state.tombstones:
        out["t"] = {key: [t.sequence, t.position, t.deleted_at_ms] for key, t in state.tombstones.items()}
    return orjson.dumps(out).decode()


def one_row_state(upsert_key: str, row: str, position: Position) -> str:
    """`encode_state` of a state holding one live row of `upsert_key` (upsert-key mode, no sequence, no
    tombstone), without building the state's objects."""
    return orjson.dumps({"v": STATE_VERSION, "l": [_row_fields(upsert_key, row, position)]}).decode()


def is_position(value: Any) -> bool:
    """Whether a stored value is a position: [topic, partition, offset]."""
    return (isinstance(value, (list, tuple)) and len(value) == 3 and isinstance(value[0], str)
            and isinstance(value[1], int) and isinstance(value[2], int))


def _position(value: Any) -> Position:
    if not is_position(value):
        raise TypeError("position must be [topic, partition, offset]")
    topic, partition, offset = value
    return (topic, partition, offset)


def _decode_row(item: dict[str, Any]) -> LiveRow:
    mode: KeyMode = "whole_row" if item.get("w") == 1 else "upsert_key"
    row = item["r"]
    key = item.get("k", row) if mode == "whole_row" else item["k"]
    if not isinstance(row, str) or not isinstance(key, str):
        raise TypeError("row and upsert key must be text")
    sequence = tuple(item["s"]) if "s" in item else None
    return LiveRow(key, row, _position(item["p"]), sequence, mode)


def _decode_tombstone(value: Any) -> Tombstone:
    sequence, position, deleted_at_ms = value
    if not isinstance(deleted_at_ms, int):
        raise TypeError("deleted_at_ms must be an integer")
    return Tombstone(tuple(sequence), _position(position), deleted_at_ms)


def decode_state(text: str) -> PkState:
    """Read a state string written by `encode_state`; StateFormatError if it is not one."""
    try:
        data = orjson.loads(text)
        if data.get("v") != STATE_VERSION:
            raise StateFormatError(f"unknown state version {data.get('v')!r}, expected {STATE_VERSION}")
        rows = [_decode_row(item) for item in data["l"]]
        tombstones = {key: _decode_tombstone(value) for key, value in data.get("t", {}).items()}
    except StateFormatError:
        raise
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StateFormatError(f"malformed state ({type(exc).__name__})") from None
    return PkState(rows, tombstones)
