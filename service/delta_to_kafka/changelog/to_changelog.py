"""TO_CHANGELOG (spec 4.2): one flush of a Delta change data feed -> append-only change records.

Rules, in the order they apply:

- Feed rows map to kinds: insert +I, update_preimage -U, update_postimage +U, delete -D.
- Inside one commit version the feed's rows are in no particular order. Per primary key, the
  -U or -D row is the key's image before the commit and the +I or +U row its image after it;
  the pair is the commit's change to the key. Two images on one side for one key break the
  primary key and fail the flush (`ChangeFeedError`).
- A -U without a +U in its commit waits in state for its +U until `state_ttl_seconds`; a +U
  without a -U takes that pending image, or (input_changelog `upsert`) the key's previous
  image. Otherwise its before image is unknown, and where the output needs one the +U is
  written as an insert (spec 4.3.3). Any other change of the key drops a pending -U.
- Compaction `per-flush` (spec 4.2.1.3.2): the changes of one key in one flush fold into one
  change from the first before image to the last after image; insert then delete is nothing.
- Records are ordered by commit version, then by first appearance in the feed; a key's
  records keep the order of its changes. A record's version is its last commit's version.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Mapping

import pyarrow as pa

from service.config.exports import ChangeFeedColumn, ExportSettings
from service.delta_to_kafka.changelog.changelog_state import ChangelogState, Image, Key, StateRecord
from vocabulary.changes import ChangeKind
from vocabulary.errors import TerminalError
from vocabulary.redaction import shown

log = logging.getLogger(__name__)

FEED_KINDS: dict[str, ChangeKind] = {
    "insert": ChangeKind.INSERT,
    "update_preimage": ChangeKind.UPDATE_BEFORE,
    "update_postimage": ChangeKind.UPDATE_AFTER,
    "delete": ChangeKind.DELETE,
}
_BEFORE_SIDE = (ChangeKind.UPDATE_BEFORE, ChangeKind.DELETE)


class ChangeFeedError(TerminalError):
    """The change feed cannot be encoded: missing column, null key, duplicate key in a commit."""


class _Unknown:
    """The before image of an update whose pre-image is not available."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


@dataclass(frozen=True)
class OutputRecord:
    """One record for the topic. `value` None is a tombstone (its `op` is None too)."""

    key: dict[str, Any]
    value: dict[str, Any] | None
    op: str | None
    commit_version: int
    commit_timestamp: datetime
    position: int


@dataclass(frozen=True)
class _Row:
    kind: ChangeKind
    key: Key
    image: Image
    version: int
    timestamp: datetime
    position: int


@dataclass
class _Change:
    """A key's change over one commit or, compacted, over a flush."""

    key: Key
    before: Image | None | _Unknown
    after: Image | None
    version: int
    timestamp: datetime
    position: int
    delete_image: Image | None = None


def _utc(value: datetime) -> datetime:
    # delta-rs gives the commit timestamp as a naive timestamp in UTC.
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


class ToChangelog:
    """Encodes flushes of one table's change feed; keeps the state of spec 4.2.1.3 in memory."""

    def __init__(self, settings: ExportSettings, state: ChangelogState | None = None) -> None:
        self.settings = settings
        self.state = state or ChangelogState(settings.state_ttl_seconds, settings.primary_key)
        self._codes = settings.op_codes
        self._images = settings.image_fields
        self._meta = tuple(c for c in settings.passthrough if c in ChangeFeedColumn.PASSABLE)
        self._columns = tuple(c for c in settings.passthrough if c not in ChangeFeedColumn.PASSABLE)
        self._distinct_images = self._images is not None and self._images[0] != self._images[1]
        # Spec 4.4: previous images are kept only for upsert input whose output needs a before image.
        self._keeps_previous = settings.input_changelog == "upsert" and (
            self._distinct_images or self._codes.combines_updates
        )

    @property
    def stateless(self) -> bool:
        """True when the next flush neither reads nor keeps state unless a commit holds half an update."""
        return len(self.state) == 0 and not self._keeps_previous

    @property
    def pairs_alone(self) -> bool:
        """True when a flush whose commits hold whole changes needs no state to write its records:
        no -U waits for its +U. Upsert input may still keep previous images (`remember_images`)."""
        return self.stateless or (self._keeps_previous and not self.state.has_pending())

    def remember_images(self, keys: list[Key], images: list[Image | None], now: float) -> None:
        """Keep each key's new image (None: deleted) as `encode_flush` does for upsert input; the
        commit changes of a flush that `pairs_alone` wrote, in record order before compaction."""
        if not self._keeps_previous:
            return
        self.state.expire(now)
        for key, image in zip(keys, images):
            self.state.remember(key, image, now)

    def encode_flush(self, feed: pa.Table, now: float) -> list[OutputRecord]:
        """Records for one flush (one or more whole commit versions); `now` is epoch seconds for TTL."""
        self.check_columns(feed)
        self.state.expire(now)
        resolved = (self._resolve(pair, now) for pair in self._commit_changes(feed))
        changes = [change for change in resolved if change is not None]
        if self.settings.compaction == "per-flush":
            changes = _compact(changes)
        changes.sort(key=lambda c: (c.version, c.position))
        return [record for change in changes for record in self._records(change)]

    def snapshot(self) -> bytes:
        """The encoder's whole state as bytes, for `restore`."""
        return self.state.snapshot()

    def restore(self, snapshot: bytes | None) -> None:
        """Continue from a `snapshot` of the same export; None starts from empty state."""
        ttl, key = self.settings.state_ttl_seconds, self.settings.primary_key
        self.state = ChangelogState(ttl, key) if snapshot is None else ChangelogState.restore(snapshot, ttl, key)

    def state_changes(self) -> list[StateRecord]:
        """State records (key bytes, value or None) of the keys touched since the last call."""
        return self.state.changes()

    def state_entries(self) -> int:
        """How many live state records the state has."""
        return self.state.keys()

    def restore_state(self, records: Mapping[bytes, bytes]) -> None:
        """Continue from the live state records of the same export (empty: from empty state)."""
        ttl, key = self.settings.state_ttl_seconds, self.settings.primary_key
        self.state = ChangelogState.load(records.values(), ttl, key)

    def check_columns(self, feed: pa.Table) -> None:
        """Raise ChangeFeedError when the feed lacks a column the export needs."""
        names = set(feed.column_names)
        where = f"change feed of table {self.settings.table!r}"
        for column in (*ChangeFeedColumn.ALL, *self.settings.primary_key, *self._columns):
            if column not in names:
                raise ChangeFeedError(f"{where} has no column {column!r}")
        if self._images is None and self.settings.op in names:
            raise ChangeFeedError(f"{where}: op field {self.settings.op!r} clashes with a table column")

    def _rows(self, feed: pa.Table) -> list[_Row]:
        rows = []
        for position, row in enumerate(feed.to_pylist()):
            change_type = row.pop(ChangeFeedColumn.CHANGE_TYPE)
            version = int(row.pop(ChangeFeedColumn.COMMIT_VERSION))
            timestamp = _utc(row.pop(ChangeFeedColumn.COMMIT_TIMESTAMP))
            where = f"table {self.settings.table!r} commit version {version} feed row {position}"
            if change_type not in FEED_KINDS:
                raise ChangeFeedError(f"{where}: unknown {ChangeFeedColumn.CHANGE_TYPE} {change_type!r}")
            for column in self.settings.primary_key:
                if row[column] is None:
                    raise ChangeFeedError(f"{where}: primary key column {column!r} is null")
            key = tuple(row[c] for c in self.settings.primary_key)
            rows.append(_Row(FEED_KINDS[change_type], key, row, version, timestamp, position))
        return rows

    def _commit_changes(self, feed: pa.Table) -> list[tuple[_Row | None, _Row | None]]:
        """Per commit version and key: (row before the commit, row after it), in feed order."""
        sides: dict[tuple[int, Key], list[_Row | None]] = {}
        for row in sorted(self._rows(feed), key=lambda r: (r.version, r.position)):
            pair = sides.setdefault((row.version, row.key), [None, None])
            side = 0 if row.kind in _BEFORE_SIDE else 1
            if pair[side] is not None:
                raise ChangeFeedError(
                    f"table {self.settings.table!r} commit version {row.version} feed row {row.position}: "
                    f"key {shown(self._key(row.key))} has two {'before' if side == 0 else 'after'} images in one "
                    "commit; the primary key is not unique"
                )
            pair[side] = row
        return [(before, after) for before, after in sides.values()]

    def _resolve(self, pair: tuple[_Row | None, _Row | None], now: float) -> _Change | None:
        before_row, after_row = pair
        first, last = before_row or after_row, after_row or before_row
        pending = self.state.take_pending(first.key, now)
        lone_after = before_row is None and after_row.kind is ChangeKind.UPDATE_AFTER
        if pending is not None and not lone_after:
            log.warning("table %r commit version %d: a pending update-before was dropped; the next change "
                        "of its key was not an update-after", self.settings.table, first.version)
        if after_row is None and before_row.kind is ChangeKind.UPDATE_BEFORE:
            self.state.put_pending(first.key, before_row.image, now)
            return None
        before: Image | None | _Unknown = before_row.image if before_row else None
        if lone_after:
            before = pending if pending is not None else self._previous(first.key, now)
            before = UNKNOWN if before is None else before
        after = after_row.image if after_row else None
        if self._keeps_previous:
            self.state.remember(first.key, after, now)
        position = min(row.position for row in pair if row is not None)
        delete_image = before_row.image if after_row is None else None
        return _Change(first.key, before, after, last.version, last.timestamp, position, delete_image)

    def _previous(self, key: Key, now: float) -> Image | None:
        return self.state.previous(key, now) if self._keeps_previous else None

    def _key(self, key: Key) -> dict[str, Any]:
        return dict(zip(self.settings.primary_key, key))

    def _records(self, change: _Change) -> list[OutputRecord]:
        if change.before is None:
            return self._emit(change, [(ChangeKind.INSERT, None, change.after)])
        if change.after is None:
            before = change.before if isinstance(change.before, dict) else change.delete_image
            deleted = self._emit(change, [(ChangeKind.DELETE, self._deleted_image(before), None)], change.delete_image)
            if self.settings.tombstones:
                tombstone = OutputRecord(self._key(change.key), None, None, change.version, change.timestamp,
                                         change.position)
                deleted.append(tombstone)
            return deleted
        return self._emit(change, self._update_parts(change))

    def _update_parts(self, change: _Change) -> list[tuple[ChangeKind, Any, Image | None]]:
        known = change.before is not UNKNOWN
        before_code = self._codes.code(ChangeKind.UPDATE_BEFORE)
        if self._codes.combines_updates or (before_code is None and self._distinct_images):
            if not known:
                return [(ChangeKind.INSERT, None, change.after)]  # spec 4.3.3: the before image is unknown
            return [(ChangeKind.UPDATE_AFTER, change.before, change.after)]
        parts: list[tuple[ChangeKind, Any, Image | None]] = []
        if before_code is not None and known and self._images is not None:
            parts.append((ChangeKind.UPDATE_BEFORE, change.before, None))
        parts.append((ChangeKind.UPDATE_AFTER, None, change.after))
        return parts

    def _deleted_image(self, image: Image) -> Image:
        if self.settings.produces_full_deletes:
            return image
        return {column: image[column] for column in self.settings.primary_key}

    def _emit(self, change: _Change, parts: list, delete_source: Image | None = None) -> list[OutputRecord]:
        records = []
        for kind, before, after in parts:
            code = self._codes.code(kind)
            if code is None:
                continue
            source = after if after is not None else (delete_source or before)
            value = self._value(code, before, after, source, change)
            records.append(OutputRecord(self._key(change.key), value, code, change.version, change.timestamp,
                                        change.position))
        return records

    def _value(self, code: str, before: Image | None, after: Image | None, source: Image,
               change: _Change) -> dict[str, Any]:
        value: dict[str, Any] = {self.settings.op: code}
        meta = {ChangeFeedColumn.COMMIT_VERSION: change.version, ChangeFeedColumn.COMMIT_TIMESTAMP: change.timestamp}
        value.update((column, meta[column]) for column in self._meta)
        if self._images is None:
            value.update(after if after is not None else before)
            return value
        value.update((column, source.get(column)) for column in self._columns)
        before_field, after_field = self._images
        if before_field == after_field:
            value[after_field] = self._payload(after if after is not None else before)
        else:
            value[before_field], value[after_field] = self._payload(before), self._payload(after)
        return value

    def _payload(self, image: Image | None) -> Image | None:
        if image is None:
            return None
        return {column: v for column, v in image.items() if column not in self._columns}


def _compact(changes: list[_Change]) -> list[_Change]:
    """One change per key: from the first before image to the last after image (spec 4.2.1.3.2)."""
    by_key: dict[Key, list[_Change]] = {}
    for change in changes:
        by_key.setdefault(change.key, []).append(change)
    folded = []
    for key_changes in by_key.values():
        first, last = key_changes[0], key_changes[-1]
        if first.before is None and last.after is None:
            continue  # inserted and deleted within the flush: the topic never needs to know
        folded.append(replace(last, before=first.before))
    return folded
