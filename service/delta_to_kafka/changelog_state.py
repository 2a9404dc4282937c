"""Keyed state of TO_CHANGELOG (spec 4.2.1.3): pending update-befores and previous images.

Both live in memory, keyed by the primary-key values, each entry stamped with the time it
was last touched. An entry expires when more than `ttl_seconds` passed since then (processing
time, spec 4.3.2); a TTL of 0 keeps entries forever. `snapshot` / `restore` turn the state into
bytes and back, values exactly as they were (ints, Decimals, datetimes, bytes).
"""

from __future__ import annotations

import copyreg
import io
import pickle
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

from service.errors import TerminalError

Image = dict[str, Any]
Key = tuple[Any, ...]

SNAPSHOT_FORMAT = 1
# Only plain data may come back from a snapshot: builtins containers plus these value types.
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
            raise StateRestoreError(f"state snapshot refers to {module}.{name}, which is not plain data")
        return super().find_class(module, name)


class ChangelogState:
    """Pending -U images (waiting for their +U) and previous images (upsert input), per key."""

    def __init__(self, ttl_seconds: float, primary_key: tuple[str, ...]) -> None:
        self.ttl_seconds = ttl_seconds
        self.primary_key = primary_key
        self._pending: dict[Key, _Entry] = {}
        self._previous: dict[Key, _Entry] = {}

    def __len__(self) -> int:
        return len(self._pending) + len(self._previous)

    def _alive(self, entry: _Entry, now: float) -> bool:
        return self.ttl_seconds == 0 or now - entry.touched <= self.ttl_seconds

    def expire(self, now: float) -> None:
        """Drop every entry not touched within the TTL."""
        for entries in (self._pending, self._previous):
            for key in [k for k, e in entries.items() if not self._alive(e, now)]:
                del entries[key]

    def take_pending(self, key: Key, now: float) -> Image | None:
        """Remove and return the key's pending -U image, if it has not expired."""
        entry = self._pending.pop(key, None)
        return entry.image if entry is not None and self._alive(entry, now) else None

    def put_pending(self, key: Key, image: Image, now: float) -> None:
        """Keep a -U image until its +U arrives."""
        self._pending[key] = _Entry(image, now)

    def previous(self, key: Key, now: float) -> Image | None:
        """The key's last after image, if it has not expired."""
        entry = self._previous.get(key)
        return entry.image if entry is not None and self._alive(entry, now) else None

    def remember(self, key: Key, image: Image | None, now: float) -> None:
        """Record the key's new image; None (deleted) forgets the key."""
        if image is None:
            self._previous.pop(key, None)
        else:
            self._previous[key] = _Entry(image, now)

    def snapshot(self) -> bytes:
        """The state as bytes, for `restore`."""
        document = {
            "format": SNAPSHOT_FORMAT,
            "primary_key": list(self.primary_key),
            "pending": [(k, e.image, e.touched) for k, e in self._pending.items()],
            "previous": [(k, e.image, e.touched) for k, e in self._previous.items()],
        }
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.dispatch_table = _DISPATCH
        pickler.dump(document)
        return buffer.getvalue()

    @classmethod
    def restore(cls, data: bytes, ttl_seconds: float, primary_key: tuple[str, ...]) -> "ChangelogState":
        """State from a `snapshot`; raises StateRestoreError if it is corrupt or for another key."""
        try:
            document = _DataUnpickler(io.BytesIO(data)).load()
        except StateRestoreError:
            raise
        except Exception as error:  # noqa: BLE001 - any unpickling failure means a corrupt snapshot
            raise StateRestoreError(f"state snapshot is corrupt ({type(error).__name__})") from None
        if not isinstance(document, dict) or document.get("format") != SNAPSHOT_FORMAT:
            raise StateRestoreError("state snapshot has an unknown format")
        if tuple(document["primary_key"]) != tuple(primary_key):
            raise StateRestoreError(
                f"state snapshot was written for primary key {document['primary_key']}, not {list(primary_key)}"
            )
        state = cls(ttl_seconds, primary_key)
        state._pending = {tuple(k): _Entry(image, touched) for k, image, touched in document["pending"]}
        state._previous = {tuple(k): _Entry(image, touched) for k, image, touched in document["previous"]}
        return state
