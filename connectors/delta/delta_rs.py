"""The embedded Delta engine: delta-rs (`deltalake`), no JVM needed.

One MERGE per micro-batch of net changes. Every commit carries an application
transaction (app id, version = batch id); `last_batch` reads it back so a replayed batch
is recognised and skipped: the offsets in Spark's checkpoint and the data in Delta move
together even when the process dies between the two.
"""

from __future__ import annotations

import json
import os
import time

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import (
    CommitProperties,
    DeltaTable,
    PostCommitHookProperties,
    Transaction,
    write_deltalake,
)
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from connectors.delta.arrow_types import plain_type, widens
from connectors.delta.log_replay import obsolete_vector_files
from connectors.delta.merge_plan import DELETE_FLAG, inserted_rows, plan_merge
from connectors.delta.small_commit import SmallCommits, Snapshot, local_root
from connectors.delta.table_scan import may_hold_deletion_vectors, scan
from vocabulary.errors import TerminalError, TransientError

__all__ = ["DELETE_FLAG", "DeltaCommitConflict", "DeltaRsTable", "DeltaSchemaError", "DeltaWriteError"]
CDF_ENABLED = {"delta.enableChangeDataFeed": "true"}
# Log checkpoints as delta-rs writes them, but no deletion of old log entries after a commit:
# that is table maintenance's job, which first checks that no export still needs them.
_POST_COMMIT = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)


class DeltaWriteError(TransientError):
    """A Delta commit failed in a way a retry may fix (conflict, storage hiccup)."""


class DeltaCommitConflict(DeltaWriteError):
    """Another writer committed first; the operation may be retried on the new version."""


class DeltaSchemaError(TerminalError):
    """The batch cannot be written to the table's schema."""


def to_widen(uri: str, current: pa.Schema, columns: dict[str, pa.DataType]) -> dict[str, pa.DataType]:
    """The columns of `columns` the table at `uri` (schema `current`) has with a narrower type: a widening
    repeated (a replayed batch) finds none. Any other type change is refused (`DeltaSchemaError`)."""
    wanted = {}
    for name, kind in columns.items():
        if name not in current.names or plain_type(current.field(name).type) == plain_type(kind):
            continue
        if not widens(current.field(name).type, kind):
            raise DeltaSchemaError(f"table {uri}: column {name!r} cannot change from {current.field(name).type} to {kind}")
        wanted[name] = kind
    return wanted


def widen_info(columns: dict[str, pa.DataType], app_id: str, batch_id: int) -> dict[str, str]:
    """Commit info of a widening: the new types and the batch that asked for it."""
    return {"cdc.widened": json.dumps({name: str(kind) for name, kind in columns.items()}),
            "cdc.app_id": app_id, "cdc.batch_id": str(int(batch_id))}


def rows_matching(keys: pa.Table) -> pc.Expression:
    """A filter passing every row whose values of `keys`' columns each occur in that column of `keys`."""
    condition = None
    for name in keys.column_names:
        one = pc.field(name).isin(pc.unique(keys.column(name)))
        condition = one if condition is None else condition & one
    return condition


class DeltaRsTable:
    """One Delta table written by delta-rs."""

    def __init__(self, uri: str, storage_options: dict[str, str] | None = None, small_commits: bool = True,
                 properties: dict[str, str] | None = None) -> None:
        """`small_commits`: a batch that fits is committed by `small_commit` instead of delta-rs's MERGE
        (False: always the MERGE, the reference the tests hold it equal to). `properties`: table properties
        the table is created with, besides the change feed's."""
        self.uri = uri
        self._created_with = {**CDF_ENABLED, **(properties or {})}
        self.storage_options = storage_options or None
        self._small = SmallCommits.of(uri) if small_commits else None
        self._table: DeltaTable | None = None
        self._checked = False
        """`last_batch` just refreshed the handle: the `schema` and `merge` of the same batch read it as is."""

    def _open(self, checked: bool = False) -> DeltaTable | None:
        """The table at its latest version; reads only the log entries added since last time. With
        `checked`, a handle `last_batch` refreshed is taken as it is: a micro-batch's commit (replay check,
        schema, MERGE) refreshes the log once. The handle's own commits keep it current."""
        if self._table is not None:
            if not (checked and self._checked):
                self._checked = False
                self._table.update_incremental()
            return self._table
        try:
            self._table = DeltaTable(self.uri, storage_options=self.storage_options)
        except TableNotFoundError:
            return None
        return self._table

    def _snapshot(self) -> Snapshot | None:
        """The small commits' snapshot when nothing was committed after it (None: read the handle)."""
        return None if self._small is None else self._small.current()

    def _loaded(self, table: DeltaTable | None) -> None:
        """The handle was just refreshed: the small commits take their snapshot from it."""
        if self._small is not None and table is not None:
            self._small.load(table)

    def schema(self) -> pa.Schema | None:
        """The table's Arrow schema, or None when the table does not exist yet."""
        snapshot = self._snapshot()
        if snapshot is not None:
            return snapshot.schema
        table = self._open(checked=True)
        return None if table is None else pa.schema(table.schema().to_arrow())

    def configuration(self) -> dict[str, str]:
        """The table's properties (empty when the table does not exist)."""
        table = self._open()
        return {} if table is None else dict(table.metadata().configuration)

    def history(self, limit: int) -> list[dict]:
        """The table's last `limit` commits, newest first (empty when the table does not exist)."""
        table = self._open()
        return [] if table is None else table.history(limit)

    def changed_elsewhere(self) -> None:
        """Another writer committed to the table (delta-spark, which reads its log through this class):
        the next read refreshes the handle even inside a micro-batch's commit."""
        self._checked = False

    def last_batch(self, app_id: str) -> int | None:
        """The highest batch id committed under `app_id`, if any (the log read again: a batch's commit
        begins here)."""
        snapshot = self._snapshot()
        if snapshot is not None and app_id in snapshot.transactions:
            return snapshot.transactions[app_id]
        table = self._open()
        self._checked = table is not None
        if table is None:
            return None
        version = table.transaction_version(app_id)
        if self._small is not None:
            self._small.load(table).transactions[app_id] = version
        return version

    def version(self) -> int | None:
        """Current table version, or None when the table does not exist."""
        table = self._open()
        return None if table is None else table.version()

    def rows_with_keys(self, keys: pa.Table) -> pa.Table:
        """The stored rows whose values of `keys`' columns are one of its rows: the files are pruned by
        each column's values, the rows then matched on all of them."""
        table = self._open()
        if table is None:
            return pa.table({})
        found = scan(table, rows_matching(keys)).read_all()
        return found.join(keys.cast(found.select(keys.column_names).schema), keys=keys.column_names,
                          join_type="left semi") if found.num_rows else found

    def create(self, schema: pa.Schema, partition_by: tuple[str, ...] = (), cluster_by: tuple[str, ...] = ()) -> None:
        """Create the table (change data feed on, partitioned by `partition_by`) unless it exists;
        delta-rs creates no clustered table (`cluster_by` is refused)."""
        if cluster_by:
            raise DeltaSchemaError(f"table {self.uri}: delta-rs cannot create a table clustered by {list(cluster_by)}")
        DeltaTable.create(
            self.uri, schema, mode="ignore", partition_by=list(partition_by) or None, configuration=self._created_with,
            storage_options=self.storage_options,
        )

    def create_with(self, changes: pa.Table, primary_key: tuple[str, ...], app_id: str, batch_id: int) -> None:
        """Create the table holding the batch's live rows (`merge`'s input), in one commit under the
        application transaction: no empty first version, no MERGE scan. A table that exists by then
        (another writer was first) is MERGEd into."""
        if self._open() is None:
            commit = CommitProperties(app_transactions=[Transaction(app_id, int(batch_id))])
            try:
                write_deltalake(self.uri, inserted_rows(changes), mode="error", configuration=self._created_with,
                                storage_options=self.storage_options, commit_properties=commit,
                                post_commithook_properties=_POST_COMMIT)
                return
            except DeltaError:
                if self._open() is None:
                    raise
        self.merge(changes, primary_key, app_id, batch_id)

    def truncate(self, app_id: str, batch_id: int) -> None:
        """Delete every row, committed with the batch's application transaction."""
        table = self._open()
        if table is None:
            return
        commit = CommitProperties(app_transactions=[Transaction(app_id, int(batch_id))])
        try:
            table.delete(commit_properties=commit, post_commithook_properties=_POST_COMMIT)
        except DeltaError as error:
            raise DeltaWriteError(f"truncate of {self.uri} failed: {error}") from None

    def merge(
        self, changes: pa.Table, primary_key: tuple[str, ...], app_id: str, batch_id: int, truncate: bool = False
    ) -> None:
        """Apply net changes (see `merge_plan`): delete where flagged, update where matched (kept
        columns keep their stored value), insert where new."""
        snapshot = self._snapshot()
        if snapshot is not None and not truncate:
            plan_merge(changes.schema, primary_key, snapshot.schema)  # the MERGE's errors for a bad batch
            if self._small_commit(changes, primary_key, app_id, batch_id):
                return
        table = self._open(checked=True)
        self._checked = False
        if table is None:
            raise DeltaSchemaError(f"table {self.uri} does not exist; create it first")
        plan = plan_merge(changes.schema, primary_key, pa.schema(table.schema().to_arrow()))
        if snapshot is None and not truncate and self._small is not None:
            self._loaded(table)
            if self._small_commit(changes, primary_key, app_id, batch_id):
                return
        commit = CommitProperties(app_transactions=[Transaction(app_id, int(batch_id))])
        try:
            merger = (
                table.merge(
                    changes, plan.predicate, source_alias=plan.source_alias, target_alias=plan.target_alias,
                    merge_schema=True, commit_properties=commit, post_commithook_properties=_POST_COMMIT,
                )
                .when_matched_delete(predicate=plan.delete.condition)
                .when_matched_update(updates=plan.update.mapping(), predicate=plan.update.condition)
                .when_not_matched_insert(updates=plan.insert.mapping(), predicate=plan.insert.condition)
            )
            if truncate:
                merger = merger.when_not_matched_by_source_delete()
            merger.execute()
        except DeltaError as error:
            raise DeltaWriteError(f"MERGE into {self.uri} failed: {error}") from None

    def _small_commit(self, changes: pa.Table, primary_key: tuple[str, ...], app_id: str, batch_id: int) -> bool:
        """The batch committed by `SmallCommits` (and the checkpoint written when one is due)."""
        small = self._small
        if small is None or not small.commit(changes, primary_key, app_id, batch_id):
            return False
        self._checked = False
        if small.checkpoint_due:
            table = self._existing("checkpoint")
            table.create_checkpoint()
            self._loaded(table)
        return True

    def widen(self, columns: dict[str, pa.DataType], app_id: str, batch_id: int) -> None:
        """Give `columns` the wider types they map to, in one commit before the batch's MERGE (see
        `to_widen`). delta-rs has no in-place type change: the table is rewritten with the columns cast
        (streamed, one overwrite commit). The commit carries no application transaction, so a batch
        replayed after it still merges; it names (app id, batch id) in its commit info only."""
        table = self._existing("widen")
        current = pa.schema(table.schema().to_arrow())
        wanted = to_widen(self.uri, current, columns)
        if not wanted:
            return
        target = pa.schema([f.with_type(wanted.get(f.name, f.type)) for f in current])
        scanned = scan(table)
        rows = pa.RecordBatchReader.from_batches(target, (batch.cast(target) for batch in scanned))
        commit = CommitProperties(custom_metadata=widen_info(wanted, app_id, batch_id))
        try:
            write_deltalake(table, rows, mode="overwrite", schema_mode="overwrite", commit_properties=commit,
                            post_commithook_properties=_POST_COMMIT)
        except CommitFailedError as error:
            raise DeltaCommitConflict(f"widening columns of {self.uri} conflicted: {error}") from None
        except DeltaError as error:
            raise DeltaWriteError(f"widening columns {sorted(wanted)} of {self.uri} failed: {error}") from None

    # --- maintenance (service/operations/maintenance.py decides when, and checks the exports first) ---

    def compact(self, z_order_by: tuple[str, ...] = (), target_size: int | None = None) -> tuple[int, int]:
        """Rewrite small files into large ones (z-ordered by `z_order_by` when given) in one commit
        without data change; returns (files removed, files added)."""
        table = self._existing("compact")
        try:
            if z_order_by:
                done = table.optimize.z_order(list(z_order_by), target_size=target_size)
            else:
                done = table.optimize.compact(target_size=target_size)
        except CommitFailedError as error:
            raise DeltaCommitConflict(f"OPTIMIZE of {self.uri} conflicted: {error}") from None
        return done["numFilesRemoved"], done["numFilesAdded"]

    def checkpoint(self) -> int:
        """Write a log checkpoint at the current version; returns that version."""
        table = self._existing("checkpoint")
        table.create_checkpoint()
        return table.version()

    def cleanup_logs(self) -> None:
        """Delete log entries older than the table's `delta.logRetentionDuration` before the last checkpoint."""
        self._existing("log cleanup").cleanup_metadata()

    def vacuum(self, retention_hours: int) -> int:
        """Delete data files removed more than `retention_hours` ago (no floor: the caller checked the
        readers); returns how many were deleted."""
        table = self._existing("VACUUM")
        deleted = len(table.vacuum(retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False))
        root = local_root(self.uri)
        if root is not None and may_hold_deletion_vectors(table):
            for path in obsolete_vector_files(root, table.version(), retention_hours, int(time.time() * 1000)):
                os.remove(path)
                deleted += 1
        return deleted

    def _existing(self, what: str) -> DeltaTable:
        table = self._open()
        if table is None:
            raise DeltaSchemaError(f"{what} of {self.uri}: the table does not exist")
        return table
