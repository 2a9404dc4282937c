"""The `maintenance:` block: scheduled compaction, log checkpoints and VACUUM of a pipeline's Delta table.

Set at the top level it applies to every pipeline's table; a pipeline's own `maintenance:`
block replaces it for that pipeline's table (the whole block, not field by field). On by
default with safe values: maintenance runs between micro-batches of the table's pipeline
(never concurrently with its MERGE), every `every_batches` committed batches or
`every_seconds` of processing time, whichever comes first.

VACUUM deletes files that were removed from the table more than `vacuum_retention_hours`
ago. Before it runs, the retention is checked against every export of the table
(service/operations/vacuum_retention.py): a retention shorter than the change feed an export has not
read yet is refused, and that VACUUM is skipped. The default of 168 hours (7 days, Delta's
own default) also covers readers that run for less than a week.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from service.config.base import SettingsModel

DEFAULT_EVERY_BATCHES = 100
DEFAULT_EVERY_SECONDS = 3600.0
DEFAULT_VACUUM_RETENTION_HOURS = 168


class MaintenanceSettings(SettingsModel):
    """When and how one Delta table is maintained (see the module docstring)."""

    enabled: bool = True
    # Run after this many committed micro-batches since the last run (null: not by count) ...
    every_batches: int | None = Field(default=DEFAULT_EVERY_BATCHES, ge=1)
    # ... or once this much processing time has passed since the last run (null: not by time).
    every_seconds: float | None = Field(default=DEFAULT_EVERY_SECONDS, gt=0)
    # Rewrite small files into files of up to `target_file_size_bytes` (null: delta-rs' 100 MiB).
    compact: bool = True
    # Z-order by the primary key instead of plain compaction (rewrites every file each run).
    z_order: bool = False
    target_file_size_bytes: int | None = Field(default=None, ge=1)
    # Write a log checkpoint, then delete log entries older than the table's
    # `delta.logRetentionDuration` (30 days by default) unless an export still needs them.
    checkpoint: bool = True
    log_cleanup: bool = True
    vacuum: bool = True
    vacuum_retention_hours: int = Field(default=DEFAULT_VACUUM_RETENTION_HOURS, ge=0)

    @model_validator(mode="after")
    def _scheduled(self) -> "MaintenanceSettings":
        if self.enabled and self.every_batches is None and self.every_seconds is None:
            raise ValueError("maintenance needs `every_batches` or `every_seconds` (or `enabled: false`)")
        return self
