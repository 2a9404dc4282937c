"""Scheduled maintenance of one pipeline's Delta table, run between its micro-batches.

A service that commits every second writes tens of thousands of small files and log entries
a day. After every committed micro-batch the pipeline calls `TableMaintenance.after_batch`;
every `every_batches` batches or `every_seconds` of processing time (settings:
service/config/maintenance.py) it runs, in this order:

  1. compaction: `optimize.compact` (or `optimize.z_order` by the primary key) rewrites small
     files into large ones in one commit without data change (no change feed rows); the table's
     layout (`table_shape`) is respected: a partitioned table is compacted partition by partition
     (no file spans two) and z-ordered by the key columns that are not partition columns; a
     liquid-clustered table is never z-ordered, its OPTIMIZE clusters it;
  2. checkpoint: a log checkpoint at the current version, so readers replay fewer log entries;
  3. log cleanup: log entries older than the table's `delta.logRetentionDuration`;
  4. VACUUM: data files removed from the table more than `vacuum_retention_hours` ago.

Steps 3 and 4 first check their retention against every export of the table
(service/operations/vacuum_retention.py) and are skipped, with a warning naming table and export, when
an export has not read the change feed that far back.

Both engines are maintained (`connectors.delta.engines.MaintainedTable`): delta-rs from the
driver, delta-spark with Delta's own OPTIMIZE, checkpoint, log cleanup and VACUUM as Spark jobs
(it needs the pipeline's Spark session). The retention check reads the table's log with
delta-rs for either engine, as `status` does.

Maintenance commits never collide with the pipeline's MERGE commits: both run on the same
thread, one after the other. Another writer of the table can still conflict with a
compaction: the step is retried on a fresh snapshot a few times. A failed or refused step
is logged and counted, never raised: maintenance does not stop ingestion, and the next run
tries again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Callable, Literal

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from connectors.delta.delta_rs import DeltaCommitConflict
from connectors.delta.engines import MaintainedTable, open_table
from service.config.settings import PipelineSettings, Settings
from service.observability import metrics
from service.operations.vacuum_retention import (
    RetentionRefused,
    UnreadFeed,
    check_retention,
    log_retention,
    unread_feeds,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
CONFLICT_ATTEMPTS = 3

Step = Callable[[MaintainedTable, DeltaTable], tuple[int, str]]  # (engine, log reader) -> (files removed, what was done)
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
                 clock: Callable[[], float] = time.monotonic, spark: "SparkSession | None" = None) -> None:
        """`spark`: the pipeline's session, which the delta-spark engine runs maintenance in."""
        self.settings = settings
        self.spark = spark
        self.pipeline = pipeline
        self.config = settings.maintenance_of(pipeline)
        self.uri = settings.lakehouse.table_uri(pipeline.table)
        self.active = self.config.enabled
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
        lakehouse = self.settings.lakehouse
        try:
            reader = DeltaTable(self.uri, storage_options=lakehouse.storage_options or None)
            table = open_table(lakehouse.engine, self.uri, lakehouse.storage_options, self.spark)
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
        results = [self._step(name, action, table, reader) for name, enabled, action in steps if enabled]
        log.info("pipeline %s: maintenance of %s: %s", self.pipeline.name, self.uri,
                 "; ".join(f"{r.step} {r.result}: {r.detail} ({r.seconds:.2f}s)" for r in results))
        return results

    def _step(self, step: str, action: Step, table: MaintainedTable, reader: DeltaTable) -> StepResult:
        started = time.monotonic()
        result: Outcome = "done"
        try:
            removed, detail = _retrying(action, table, reader)
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

    def _compact(self, table: MaintainedTable, reader: DeltaTable) -> tuple[int, str]:
        z_order_by, how = self._z_order_by(reader)
        removed, added = table.compact(z_order_by, self.config.target_file_size_bytes)
        return removed, f"{removed} files rewritten into {added}{how}"

    def _z_order_by(self, reader: DeltaTable) -> tuple[tuple[str, ...], str]:
        """The columns to z-order by under the table's layout, and how the compaction goes in words."""
        clustered = "clustering" in (reader.protocol().writer_features or [])
        if clustered or self.pipeline.table_shape.cluster_by:
            return (), " (clustered: OPTIMIZE clusters)"
        partitions = reader.metadata().partition_columns
        z_order_by = tuple(c for c in self.pipeline.primary_key if c not in partitions) if self.config.z_order else ()
        by = f", z-ordered by {', '.join(z_order_by)}" if z_order_by else ""
        return z_order_by, (f" (per partition of {', '.join(partitions)}{by})" if partitions else by)

    def _checkpoint(self, table: MaintainedTable, reader: DeltaTable) -> tuple[int, str]:
        return 0, f"at version {table.checkpoint()}"

    def _cleanup_logs(self, table: MaintainedTable, reader: DeltaTable) -> tuple[int, str]:
        retention = log_retention(reader)
        check_retention("log cleanup", retention, self._unread(reader), datetime.now(timezone.utc))
        table.cleanup_logs()
        return 0, f"log entries older than {retention.total_seconds() / 3600:.0f} h before the last checkpoint"

    def _vacuum(self, table: MaintainedTable, reader: DeltaTable) -> tuple[int, str]:
        hours = self.config.vacuum_retention_hours
        check_retention("VACUUM", timedelta(hours=hours), self._unread(reader), datetime.now(timezone.utc))
        # The retention rule above replaces the engines' fixed 7-day floor.
        deleted = table.vacuum(hours)
        return deleted, f"{deleted} files removed more than {hours} h ago deleted"

    def _unread(self, table: DeltaTable) -> list[UnreadFeed]:
        """The exports' unread change feeds, read once per run (after compaction: exports only advance)."""
        if self._feeds is None:
            try:
                table.update_incremental()
                self._feeds = unread_feeds(self.settings, self.pipeline.table, table)
            except Exception as error:  # noqa: BLE001 - unknown positions are not safe to vacuum past
                raise RetentionRefused(
                    f"table {self.uri}: the positions of its exports cannot be read ({error}); nothing is deleted"
                ) from None
        return self._feeds


def _retrying(action: Step, table: MaintainedTable, reader: DeltaTable) -> tuple[int, str]:
    """Run `action`; a commit conflict with another writer is retried (each engine reads the latest version)."""
    for attempt in range(1, CONFLICT_ATTEMPTS + 1):
        try:
            return action(table, reader)
        except DeltaCommitConflict:
            if attempt == CONFLICT_ATTEMPTS:
                raise
    raise AssertionError("unreachable")
