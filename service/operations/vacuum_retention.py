"""The retention rules of table maintenance: never delete files or log entries an export still needs.

An export reads a table's change feed from the first version it has not published (its
position in Kafka, or its checkpoint if that is behind: a restart replays from the
checkpoint). VACUUM deletes data files removed from the table more than the retention ago,
and log cleanup deletes log entries older than the table's log retention. Both are safe for
an export exactly when the retention is longer than the age of the oldest commit the export
has not read, counting only commits that change data: OPTIMIZE and VACUUM commits have no
change feed and only remove files that older, already read, versions added. A shorter
retention is refused with `RetentionRefused`, naming table and export; an export whose
position cannot be read refuses it too (unknown is not safe).

Only exports configured in the same settings are known: an export of the table run by
another deployment must be covered by the retention itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Iterable

from deltalake import DeltaTable

from connectors.kafka.cluster import ClusterView
from service.config.exports import ExportSettings
from service.config.settings import Settings
from service.operations.status import export_status

NO_FEED_OPERATIONS = frozenset({"OPTIMIZE", "VACUUM START", "VACUUM END"})
DEFAULT_LOG_RETENTION = timedelta(days=30)
_INTERVAL = re.compile(r"^\s*(?:interval\s+)?(\d+)\s*(second|minute|hour|day|week)s?\s*$", re.IGNORECASE)


class RetentionRefused(Exception):
    """A retention would delete files or log entries an export has not read yet."""


@dataclass(frozen=True)
class UnreadFeed:
    """What one export of a table has not read: from `from_version`, the oldest data commit at `since`."""

    export: str
    table: str
    from_version: int
    since: datetime | None  # None: nothing unread that changes data
    error: str | None = None  # the export's position could not be read

    def age(self, now: datetime) -> timedelta:
        """How long ago the oldest unread data commit was made (zero when there is none)."""
        return timedelta(0) if self.since is None else max(timedelta(0), now - self.since)


def check_retention(step: str, retention: timedelta, feeds: Iterable[UnreadFeed], now: datetime) -> None:
    """Raise `RetentionRefused` unless `retention` is longer than every export's unread change feed."""
    for feed in feeds:
        if feed.error is not None:
            raise RetentionRefused(
                f"{step} of table {feed.table} refused: the position of export {feed.export} cannot be read "
                f"({feed.error}), so the files it still needs are unknown"
            )
        age = feed.age(now)
        if feed.since is not None and retention <= age:
            raise RetentionRefused(
                f"{step} of table {feed.table} refused: export {feed.export} has not read the change feed from "
                f"version {feed.from_version} on (its oldest unread commit is {_hours(age)} old, at "
                f"{feed.since.isoformat()}), and a retention of {_hours(retention)} would delete what it still "
                "needs; let the export catch up or choose a longer retention"
            )


def _hours(span: timedelta) -> str:
    return f"{span.total_seconds() / 3600:.2f} h"


def log_retention(table: DeltaTable) -> timedelta:
    """The table's `delta.logRetentionDuration` (Delta's default: 30 days)."""
    text = table.metadata().configuration.get("delta.logRetentionDuration")
    match = _INTERVAL.match(text or "")
    if match is None:
        return DEFAULT_LOG_RETENTION
    return timedelta(**{f"{match.group(2).lower()}s": int(match.group(1))})


def first_unread(checkpoint_version: int | None, published_version: int | None, starting_version: int) -> int:
    """The first version an export may still read: after the older of its checkpoint and its position."""
    done = [version for version in (checkpoint_version, published_version) if version is not None]
    return min(done) + 1 if done else starting_version


def oldest_data_commit(table: DeltaTable, from_version: int, not_before: datetime | None = None) -> datetime | None:
    """Time of the oldest commit at or after `from_version` that changes data (None: there is none)."""
    latest = table.version()
    if from_version > latest:
        return None
    times = [
        datetime.fromtimestamp(commit["timestamp"] / 1000, timezone.utc)
        for commit in table.history(latest - from_version + 1)
        if commit["version"] >= from_version and commit.get("operation") not in NO_FEED_OPERATIONS
    ]
    times = [at for at in times if not_before is None or at >= not_before]
    return min(times) if times else None


def _unread(settings: Settings, export: ExportSettings, table: DeltaTable, cluster: ClusterView) -> UnreadFeed:
    uri = settings.lakehouse.table_uri(export.table)
    try:
        status = export_status(settings, export, cluster)
    except Exception as error:  # noqa: BLE001 - any failure to read a position refuses the retention
        return UnreadFeed(export.name, uri, 0, None, error=str(error) or type(error).__name__)
    start = first_unread(status.checkpoint_version, status.published_version, export.starting_version or 0)
    nothing_read = status.checkpoint_version is None and status.published_version is None
    not_before = export.starting_timestamp if nothing_read else None
    if not_before is not None and not_before.tzinfo is None:
        not_before = not_before.replace(tzinfo=timezone.utc)
    return UnreadFeed(export.name, uri, start, oldest_data_commit(table, start, not_before))


def unread_feeds(settings: Settings, table_name: str, table: DeltaTable) -> list[UnreadFeed]:
    """What each configured export of table `table_name` has not read yet."""
    exports = [export for export in settings.exports if export.table == table_name]
    if not exports:
        return []
    cluster = ClusterView(settings.kafka.client_config())
    try:
        return [_unread(settings, export, table, cluster) for export in exports]
    finally:
        cluster.close()
