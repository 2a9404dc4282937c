"""The Delta engines behind one interface, and the factory that picks one by name.

`delta-rs` (default) writes from the driver with no JVM jars; `delta-spark` runs MERGE and
change-feed reads as Spark jobs, for tables one driver cannot handle, where the Delta
jars are on the Spark classpath.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

from vocabulary.engines import ENGINES, Engine
from vocabulary.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from connectors.delta.delta_rs import DeltaRsTable
    from connectors.delta.delta_spark import DeltaSparkTable


class DeltaEngineTable(Protocol):
    """What the MERGE sink needs from one Delta table; `DeltaRsTable` and `DeltaSparkTable`
    both satisfy it completely (mypy checks it in CI: tests/project/test_types.py)."""

    uri: str

    def schema(self) -> pa.Schema | None:
        """The table's Arrow schema, or None when the table does not exist yet."""

    def last_batch(self, app_id: str) -> int | None:
        """The highest batch id committed under `app_id`, if any."""

    def version(self) -> int | None:
        """Current table version, or None when the table does not exist."""

    def configuration(self) -> dict[str, str]:
        """The table's properties (empty when the table does not exist)."""

    def rows_with_keys(self, keys: pa.Table) -> pa.Table:
        """The stored rows whose values of `keys`' columns are one of its rows (empty when the table
        does not exist)."""

    def create(self, schema: pa.Schema, partition_by: tuple[str, ...] = (), cluster_by: tuple[str, ...] = ()) -> None:
        """Create the table (change data feed on, partitioned by `partition_by` or clustered by
        `cluster_by`) unless it exists."""

    def create_with(self, changes: pa.Table, primary_key: tuple[str, ...], app_id: str, batch_id: int) -> None:
        """Create the table holding what a `merge` of `changes` into an empty table would leave, under
        the application transaction (app_id, batch_id); an existing table is MERGEd into."""

    def truncate(self, app_id: str, batch_id: int) -> None:
        """Delete every row in one commit under the application transaction (app_id, batch_id)."""

    def widen(self, columns: dict[str, pa.DataType], app_id: str, batch_id: int) -> None:
        """Give the table's `columns` the wider types they map to, in one commit without the application
        transaction (a replayed batch must still merge); a column already of its type is left alone."""

    def merge(
        self, changes: pa.Table, primary_key: tuple[str, ...], app_id: str, batch_id: int, truncate: bool = False
    ) -> None:
        """Apply one batch of net changes (see `merge_plan`) under the application transaction
        (app_id, batch_id); with `truncate`, every stored row the batch does not match is
        deleted in the same commit (a source TRUNCATE followed by the batch's changes)."""


class MaintainedTable(Protocol):
    """What table maintenance (service/operations/maintenance.py) needs from one Delta table; both engines
    satisfy it. A commit conflict raises `DeltaCommitConflict`."""

    uri: str

    def compact(self, z_order_by: tuple[str, ...] = (), target_size: int | None = None) -> tuple[int, int]:
        """Rewrite small files (z-ordered by `z_order_by` when given) in one commit without data
        change; returns (files removed, files added)."""

    def checkpoint(self) -> int:
        """Write a log checkpoint at the current version (deleting no log entry); returns that version."""

    def cleanup_logs(self) -> None:
        """Delete log entries older than the table's `delta.logRetentionDuration` before the last checkpoint."""

    def vacuum(self, retention_hours: int) -> int:
        """Delete data files removed more than `retention_hours` ago (no floor of its own); returns how many."""


class EngineTable(DeltaEngineTable, MaintainedTable, Protocol):
    """A table of either engine: written by the MERGE sink, maintained between its batches."""


if TYPE_CHECKING:
    # Every engine satisfies the whole protocol: mypy fails here when one misses a member
    # or a parameter (the sink calls each of them).
    _ENGINES_CONFORM: tuple[type[EngineTable], ...] = (DeltaRsTable, DeltaSparkTable)


def open_table(
    engine: Engine,
    uri: str,
    storage_options: dict[str, str] | None = None,
    spark: "SparkSession | None" = None,
    properties: dict[str, str] | None = None,
) -> EngineTable:
    """The table at `uri` written by `engine`; delta-spark needs the running `spark` session. `properties`:
    Delta table properties the table is created with (besides the change feed's)."""
    if engine == "delta-rs":
        from connectors.delta.delta_rs import DeltaRsTable

        return DeltaRsTable(uri, storage_options, properties=properties)
    if engine == "delta-spark":
        if spark is None:
            raise ConfigError(f"lakehouse.engine delta-spark needs a Spark session to open {uri}")
        from connectors.delta.delta_spark import DeltaSparkTable

        return DeltaSparkTable(spark, uri, storage_options, properties)
    raise ConfigError(f"lakehouse.engine {engine!r} is not one of {', '.join(ENGINES)}")
