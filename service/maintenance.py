"""Scheduled maintenance of one pipeline's Delta table, run between its micro-batches.

A service that commits every second writes tens of thousands of small files and log entries
a day. After every committed micro-batch the pipeline calls `TableMaintenance.after_batch`;
every `every_batches` batches or `every_seconds` of processing time (settings:
service/maintenance_settings.py) it runs, in this order:

  1. compaction: `optimize.compact` (or `optimize.z_order` by the primary key) rewrites small
     files into large ones in one commit without data change (no change feed rows);
  2. checkpoint: a log checkpoint at the current version, so readers replay fewer log entries;
  3. log cleanup: log entries older than the table's `delta.logRetentionDuration`;
  4. VACUUM: data files removed from the table more than `vacuum_retention_hours` ago.

Steps 3 and 4 first check their retention against every export of the table
(service/vacuum_retention.py) and are skipped, with a warning naming table and export, when
an export has not read the change feed that far back.

Maintenance commits never collide with the pipeline's MERGE commits: both run on the same
thread, one after the other. Another writer of the table can still conflict with a
compaction: the step is retried on a fresh snapshot a few times. A failed or refused step
is logged and counted, never raised: maintenance does not stop ingestion, and the next run
tries again. Only the delta-rs engine is maintained here (delta-spark tables are maintained
with Delta's own OPTIMIZE and VACUUM on the cluster).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Callable, Literal

from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from service import metrics
from service.settings import PipelineSettings, Settings
from service.vacuum_retention import RetentionRefused, UnreadFeed, check_retention, log_retention, unread_feeds

log = logging.getLogger(__name__)
CONFLICT_ATTEMPTS = 3

Step = Callable[[DeltaTable], tuple[int, str]]  # -> (files removed, what was done)
Outcome = Literal["done", "refused", "failed"]


@dataclass(frozen=True)
class StepResult:
    """One maintenance step of one run: `done`, `refused` (retention) or `failed` (any error)."""

    step: str
    result: Outcome
    files_removed: int
    seconds: float
    detail: str


class TableMaintenance:
    """Compaction, checkpoints, log cleanup and VACUUM of one pipeline's table, on a schedule."""

    def __init__(self, settings: Settings, pipeline: PipelineSettings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.config = settings.maintenance_of(pipeline)
        self.uri = settings.lakehouse.table_uri(pipeline.table)
        self.active = self.config.enabled and settings.lakehouse.engine == "delta-rs"
        self._clock = clock
        self._batches = 0
        self._last_run = clock()
        self._feeds: list[UnreadFeed] | None = None

    def due(self) -> bool:
        """Whether enough batches or processing time have passed since the last run."""
        config = self.config
        by_count = config.every_batches is not None and self._batches >= config.every_batches
        by_time = config.every_seconds is not None and self._clock() - self._last_run >= config.every_seconds
        return by_count or by_time

    def after_batch(self) -> list[StepResult]:
        """Call after each committed micro-batch; runs maintenance when it is due."""
        if not self.active:
            return []
        self._batches += 1
        return self.run() if self.due() else []

    def run(self) -> list[StepResult]:
        """Run every enabled step now; returns what each did (nothing when the table does not exist)."""
        self._batches, self._last_run, self._feeds = 0, self._clock(), None
        try:
            table = DeltaTable(self.uri, storage_options=self.settings.lakehouse.storage_options or None)
        except TableNotFoundError:
            return []
        except Exception as error:  # noqa: BLE001 - maintenance never stops ingestion
            log.warning("pipeline %s: maintenance of %s skipped: %s", self.pipeline.name, self.uri, error)
            return []
        config = self.config
        steps: list[tuple[str, bool, Step]] = [
            ("compact", config.compact or config.z_order, self._compact),
            ("checkpoint", config.checkpoint, self._checkpoint),
            ("log_cleanup", config.log_cleanup, self._cleanup_logs),
            ("vacuum", config.vacuum, self._vacuum),
        ]
        results = [self._step(name, action, table) for name, enabled, action in steps if enabled]
        log.info("pipeline %s: maintenance of %s: %s", self.pipeline.name, self.uri,
                 "; ".join(f"{r.step} {r.result}: {r.detail} ({r.seconds:.2f}s)" for r in results))
        return results

    def _step(self, step: str, action: Step, table: DeltaTable) -> StepResult:
        started = time.monotonic()
        result: Outcome = "done"
        try:
            removed, detail = _retrying(action, table)
        except RetentionRefused as refusal:
            removed, detail, result = 0, str(refusal), "refused"
            log.warning("pipeline %s: %s", self.pipeline.name, refusal)
        except Exception as error:  # noqa: BLE001 - maintenance never stops ingestion; the next run tries again
            removed, detail, result = 0, f"{type(error).__name__}: {error}", "failed"
            log.warning("pipeline %s: maintenance step %s of %s failed: %s", self.pipeline.name, step, self.uri, error)
        seconds = time.monotonic() - started
        name = self.pipeline.name
        metrics.MAINTENANCE_RUNS.labels(name, step, result).inc()
        metrics.MAINTENANCE_FILES_REMOVED.labels(name, step).inc(removed)
        metrics.MAINTENANCE_SECONDS.labels(name, step).observe(seconds)
        return StepResult(step, result, removed, seconds, detail)

    def _compact(self, table: DeltaTable) -> tuple[int, str]:
        size = self.config.target_file_size_bytes
        if self.config.z_order:
            done = table.optimize.z_order(self.pipeline.primary_key, target_size=size)
        else:
            done = table.optimize.compact(target_size=size)
        removed, added = done["numFilesRemoved"], done["numFilesAdded"]
        return removed, f"{removed} files rewritten into {added}"

    def _checkpoint(self, table: DeltaTable) -> tuple[int, str]:
        table.create_checkpoint()
        return 0, f"at version {table.version()}"

    def _cleanup_logs(self, table: DeltaTable) -> tuple[int, str]:
        retention = log_retention(table)
        check_retention("log cleanup", retention, self._unread(table), datetime.now(timezone.utc))
        table.cleanup_metadata()
        return 0, f"log entries older than {retention.total_seconds() / 3600:.0f} h before the last checkpoint"

    def _vacuum(self, table: DeltaTable) -> tuple[int, str]:
        hours = self.config.vacuum_retention_hours
        check_retention("VACUUM", timedelta(hours=hours), self._unread(table), datetime.now(timezone.utc))
        # The retention rule above replaces delta-rs' fixed 7-day floor.
        deleted = table.vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=False)
        return len(deleted), f"{len(deleted)} files removed more than {hours} h ago deleted"

    def _unread(self, table: DeltaTable) -> list[UnreadFeed]:
        """The exports' unread change feeds, read once per run (after compaction: exports only advance)."""
        if self._feeds is None:
            try:
                self._feeds = unread_feeds(self.settings, self.pipeline.table, table)
            except Exception as error:  # noqa: BLE001 - unknown positions are not safe to vacuum past
                raise RetentionRefused(
                    f"table {self.uri}: the positions of its exports cannot be read ({error}); nothing is deleted"
                ) from None
        return self._feeds


def _retrying(action: Step, table: DeltaTable) -> tuple[int, str]:
    """Run `action`; a commit conflict with another writer is retried on a fresh snapshot."""
    for attempt in range(1, CONFLICT_ATTEMPTS + 1):
        try:
            return action(table)
        except CommitFailedError:
            if attempt == CONFLICT_ATTEMPTS:
                raise
            table.update_incremental()
    raise AssertionError("unreachable")
