"""Keyed state of TO_CHANGELOG (spec 4.2.1.3): pending update-befores and previous images.

Both live in memory, keyed by the primary-key values, each entry stamped with the time it
was last touched. An entry expires when more than `ttl_seconds` passed since then (processing
time, spec 4.3.2); a TTL of 0 keeps entries forever.

Persisted per key (the export keeps them in a compacted Kafka topic, see export_position.py):
every key touched since the last `changes()` is marked; `changes()` returns one state record
per marked key, `(key bytes, value bytes)` with the key's pending and previous entries, or
`(key bytes, None)`, a tombstone, once the key has neither. The key bytes are a canonical
encoding of the primary-key values (equal values, equal bytes), so log compaction keeps the
last record of each key. `load` rebuilds the state from the live records. Values come back
exactly as they were (ints, Decimals, datetimes, bytes); only plain data is unpickled.
`snapshot` / `restore` turn the whole state into one blob and back (tests, and positions
written before the state topic existed); a restored state marks every key for `changes()`.
"""

from __future__ import annotations

import base64
import copyreg
import io
import json
import pickle
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, Iterable
from zoneinfo import ZoneInfo

from vocabulary.errors import TerminalError
from vocabulary.redaction import shown

Image = dict[str, Any]
Key = tuple[Any, ...]
StateRecord = tuple[bytes, bytes | None]

SNAPSHOT_FORMAT = 1
ENTRY_FORMAT = 1
_PICKLE_PROTOCOL = 5  # fixed, so the bytes do not change with the interpreter
# Only plain data may come back from state bytes: builtins containers plus these value types.
_ALLOWED_GLOBALS = {
    ("datetime", "datetime"), ("datetime", "date"), ("datetime", "time"), ("datetime", "timedelta"),
    ("datetime", "timezone"), ("decimal", "Decimal"), ("zoneinfo", "ZoneInfo"),
}
# A zone is written as its name, so that restoring it needs nothing beyond ZoneInfo itself.
_DISPATCH = copyreg.dispatch_table.copy()
_DISPATCH[ZoneInfo] = lambda zone: (ZoneInfo, (zone.key,))


class StateRestoreError(TerminalError):
    """A state snapshot cannot be restored: corrupt, or written for another primary key."""


@dataclass
class _Entry:
    image: Image
    touched: float


class _DataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise StateRestoreError(f"state data refers to {module}.{name}, which is not plain data")
        return super().find_class(module, name)


class _Dumper:
    """One pickler reused for many small documents (building one per entry costs more than the entry)."""

    def __init__(self) -> None:
        self._buffer = io.BytesIO()
        self._pickler = pickle.Pickler(self._buffer, protocol=_PICKLE_PROTOCOL)
        self._pickler.dispatch_table = _DISPATCH

    def __call__(self, document: Any) -> bytes:
        self._buffer.seek(0)
        self._buffer.truncate()
        self._pickler.clear_memo()
        self._pickler.dump(document)
        return self._buffer.getvalue()


def _dumps(document: Any) -> bytes:
    return _Dumper()(document)


def _loads(data: bytes, what: str) -> Any:
    try:
        return _DataUnpickler(io.BytesIO(data)).load()
    except StateRestoreError:
        raise
    except Exception as error:  # noqa: BLE001 - any unpickling failure means corrupt data
        raise StateRestoreError(f"{what} is corrupt ({type(error).__name__})") from None


def _canonical(value: Any) -> Any:
    """A JSON form of one key value that is equal exactly when the values are."""
    if type(value) is str:
        return value
    if type(value) is int:
        return ["int", str(value)]
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bool):
        return ["bool", value]
    if isinstance(value, int):
        return ["int", str(value)]
    if isinstance(value, float):
        return ["float", value.hex()]
    if isinstance(value, (bytes, bytearray)):
        return ["bytes", base64.b64encode(value).decode("ascii")]
    if isinstance(value, datetime) and value.tzinfo is not None:
        return ["datetime", value.astimezone(timezone.utc).isoformat()]
    if isinstance(value, (Decimal, datetime, date, time, timedelta)):
        return [type(value).__name__, str(value)]
    return [type(value).__name__, repr(value)]


_KEY_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def key_bytes(key: Key) -> bytes:
    """The state record key of a primary key: canonical, so compaction finds the key's last record."""
    return _KEY_JSON.encode([_canonical(v) for v in key]).encode("utf-8")


def _pair(entry: _Entry | None) -> tuple[Image, float] | None:
    return None if entry is None else (entry.image, entry.touched)


def _entry(pair: Any) -> _Entry | None:
    return None if pair is None else _Entry(pair[0], pair[1])


class ChangelogState:
    """Pending -U images (waiting for their +U) and previous images (upsert input), per key."""

    def __init__(self, ttl_seconds: float, primary_key: tuple[str, ...]) -> None:
        self.ttl_seconds = ttl_seconds
        self.primary_key = tuple(primary_key)
        self._pending: dict[Key, _Entry] = {}
        self._previous: dict[Key, _Entry] = {}
        self._changed: dict[Key, None] = {}  # insertion-ordered set: records in change order

    def __len__(self) -> int:
        return len(self._pending) + len(self._previous)

    def has_pending(self) -> bool:
        """True when a -U image waits for its +U."""
        return bool(self._pending)

    def keys(self) -> int:
        """How many keys hold an entry (the number of live state records)."""
        return len(self._previous) + sum(1 for key in self._pending if key not in self._previous)

    def _alive(self, entry: _Entry, now: float) -> bool:
        return self.ttl_seconds == 0 or now - entry.touched <= self.ttl_seconds

    def expire(self, now: float) -> None:
        """Drop every entry not touched within the TTL."""
        if self.ttl_seconds == 0:
            return
        for entries in (self._pending, self._previous):
            for key in [k for k, e in entries.items() if not self._alive(e, now)]:
                del entries[key]
                self._changed[key] = None

    def take_pending(self, key: Key, now: float) -> Image | None:
        """Remove and return the key's pending -U image, if it has not expired."""
        entry = self._pending.pop(key, None)
        if entry is None:
            return None
        self._changed[key] = None
        return entry.image if self._alive(entry, now) else None

    def put_pending(self, key: Key, image: Image, now: float) -> None:
        """Keep a -U image until its +U arrives."""
        self._pending[key] = _Entry(image, now)
        self._changed[key] = None

    def previous(self, key: Key, now: float) -> Image | None:
        """The key's last after image, if it has not expired."""
        entry = self._previous.get(key)
        return entry.image if entry is not None and self._alive(entry, now) else None

    def remember(self, key: Key, image: Image | None, now: float) -> None:
        """Record the key's new image; None (deleted) forgets the key."""
        if image is not None:
            self._previous[key] = _Entry(image, now)
        elif self._previous.pop(key, None) is None:
            return
        self._changed[key] = None

    def changes(self) -> list[StateRecord]:
        """A state record per key touched since the last call: its entries, or a tombstone."""
        records, dumps = [], _Dumper()
        for key in self._changed:
            pending, previous = self._pending.get(key), self._previous.get(key)
            value = None
            if pending is not None or previous is not None:
                value = dumps((ENTRY_FORMAT, self.primary_key, key, _pair(pending), _pair(previous)))
            records.append((key_bytes(key), value))
        self._changed = {}
        return records

    @classmethod
    def load(cls, values: Iterable[bytes], ttl_seconds: float, primary_key: tuple[str, ...]) -> "ChangelogState":
        """State from the values of the live state records; StateRestoreError names a bad one."""
        state = cls(ttl_seconds, primary_key)
        for value in values:
            document = _loads(value, "state record")
            if not isinstance(document, tuple) or len(document) != 5 or document[0] != ENTRY_FORMAT:
                raise StateRestoreError("state record has an unknown format")
            _, columns, key, pending, previous = document
            if tuple(columns) != state.primary_key:
                raise StateRestoreError(
                    f"state record of key {shown(list(key))} was written for primary key {list(columns)}, "
                    f"not {list(state.primary_key)}"
                )
            for entries, pair in ((state._pending, pending), (state._previous, previous)):
                if pair is not None:
                    entries[tuple(key)] = _entry(pair)
        return state

    def snapshot(self) -> bytes:
        """The whole state as bytes, for `restore`."""
        return _dumps({
            "format": SNAPSHOT_FORMAT,
            "primary_key": list(self.primary_key),
            "pending": [(k, e.image, e.touched) for k, e in self._pending.items()],
            "previous": [(k, e.image, e.touched) for k, e in self._previous.items()],
        })

    @classmethod
    def restore(cls, data: bytes, ttl_seconds: float, primary_key: tuple[str, ...]) -> "ChangelogState":
        """State from a `snapshot`, every key marked for `changes()`; StateRestoreError if corrupt."""
        document = _loads(data, "state snapshot")
        if not isinstance(document, dict) or document.get("format") != SNAPSHOT_FORMAT:
            raise StateRestoreError("state snapshot has an unknown format")
        if tuple(document["primary_key"]) != tuple(primary_key):
            raise StateRestoreError(
                f"state snapshot was written for primary key {document['primary_key']}, not {list(primary_key)}"
            )
        state = cls(ttl_seconds, primary_key)
        state._pending = {tuple(k): _Entry(image, touched) for k, image, touched in document["pending"]}
        state._previous = {tuple(k): _Entry(image, touched) for k, image, touched in document["previous"]}
        state._changed = dict.fromkeys([*state._pending, *state._previous])
        return state
