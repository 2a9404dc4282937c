"""A database source as one streaming query: Kafka (every table's topic) -> net changes -> one MERGE per table.

The source (`source.database_ranges`) reduces each Kafka range to its table's net changes where it
is read, as a pipeline's plain path does. Per micro-batch, here on the driver: the payloads are
split by table, each table's ranges merged (`batch_changes`), its bad records handled by the
database's policies, and its MERGE committed with its own application id and the batch id, so a
crash between two tables' commits replays exactly (a table already holding the batch skips it).
MERGEs of different tables run side by side (`parallel_merges`).

A terminal error of one table (a value its column cannot take, a bad record under FAIL) stops
the service (`on_table_error: stop`) or quarantines that table (`quarantine`): its offsets stop
advancing (`runtime.quarantine`), the other tables go on, and the next start of the service tries
it again from the offsets where it stopped.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from connectors.delta.engines import DeltaEngineTable, open_table
from service.config.databases import DatabaseSettings
from service.config.settings import Settings, table_pipeline
from service.kafka_to_delta.plan.table_routes import check_routes, store_routes, stored_routes
from service.kafka_to_delta.rows.payload_spool import PayloadSpool, payload_spool
from service.kafka_to_delta.sink.bad_records import DeadLetterStore, handle_bad_records
from service.kafka_to_delta.sink.dead_letters import DeadLetterSink
from service.kafka_to_delta.sink.merge_sink import MergeOutcome, MergeSink
from service.kafka_to_delta.source.batch_changes import batch_changes
from service.kafka_to_delta.source.database_ranges import (
    TABLE_COLUMN,
    database_source,
    database_source_name,
)
from service.kafka_to_delta.table_query import QueryIdentity, count_merged
from service.observability import metrics
from service.operations.maintenance import TableMaintenance
from service.runtime import quarantine
from service.runtime.checkpoints import batch_start_offsets, remove_abandoned_writes
from service.supervisor.batch_pipeline import BatchPipeline, commit_app_id, with_trigger
from vocabulary.errors import DecodeError, TerminalError

log = logging.getLogger(__name__)


@dataclass
class TableState:
    """One table of the database as the query writes it."""

    name: str
    primary_key: tuple[str, ...]
    engine_table: DeltaEngineTable
    sink: MergeSink
    maintenance: TableMaintenance
    committed_batches: int = 0
    last_outcome: MergeOutcome | None = None
    rows: int = 0
    errors: int = 0
    topics: set[str] = field(default_factory=set)


class DatabaseQuery(QueryIdentity, BatchPipeline):
    """Runs one `DatabaseSettings` as one streaming query into one Delta table per source table."""

    def __init__(self, spark: SparkSession, settings: Settings, database: DatabaseSettings) -> None:
        self.spark = spark
        self.settings = settings
        self.database = database
        self.tables: dict[str, TableState] = {}
        self.committed_batches = 0
        self.failure: BaseException | None = None
        self._query: StreamingQuery | None = None
        self._query_id: str | None = None
        self._started = threading.Event()
        self._lock = threading.Lock()
        self._routes: dict[str, str] = {}
        self._batch_ended: float | None = None
        self.spool: PayloadSpool | None = None  # the payloads handed over in files (local master)
        self.dead_letters: DeadLetterStore | None = None
        if database.dead_letters is not None:
            sink = DeadLetterSink.for_pipeline(settings, database.name, database.dead_letters)
            self.dead_letters = lambda rows, batch_id: sink.store(
                rows, batch_id, app_id=commit_app_id(database.name, "dead-letters", self._query_id))

    @property
    def name(self) -> str:
        """The query's name (the database's)."""
        return self.database.name

    @property
    def checkpoint(self) -> str:
        return self.settings.checkpoint_dir(self.database.name)

    @property
    def quarantine_file(self) -> str:
        return f"{self.checkpoint.rstrip('/')}/{quarantine.FILE_NAME}"

    def app_id(self, table: str) -> str:
        """Application id of one table's Delta commits; the query id ties it to the checkpoint."""
        return commit_app_id(self.database.name, table, self._query_id)

    def quarantined(self) -> dict[str, dict[str, Any]]:
        """The tables set aside, with why and since which batch."""
        return {t: e for t, e in quarantine.read(self.quarantine_file).items() if e.get("state") == quarantine.QUARANTINED}

    def _table(self, table: str, primary_key: tuple[str, ...], topics: list[str]) -> TableState:
        with self._lock:
            state = self.tables.get(table)
            if state is None:
                lakehouse = self.settings.lakehouse
                engine_table = open_table(lakehouse.engine, lakehouse.table_uri(table), lakehouse.storage_options,
                                          self.spark)
                pipeline = table_pipeline(self.database, table, topics, primary_key)
                sink = MergeSink(engine_table, primary_key, self.database.schema_changes, one_commit_create=True)
                state = TableState(table, primary_key, engine_table, sink,
                                   TableMaintenance(self.settings, pipeline, spark=self.spark))
                self.tables[table] = state
                self._routes.update({topic: table for topic in topics})
                store_routes(self.checkpoint, self._routes)
                log.info("database %s: table %s from topic(s) %s, primary key (%s)", self.name, table,
                         ", ".join(sorted(topics)), ", ".join(primary_key))
            elif state.primary_key != primary_key:
                raise DecodeError(f"database {self.database.name}, table {table}: the Kafka key's fields changed "
                                  f"from ({', '.join(state.primary_key)}) to ({', '.join(primary_key)}); a primary "
                                  "key change needs the table rebuilt")
            state.topics.update(topics)
            return state

    def _process_batch(self, batch: DataFrame, batch_id: int) -> None:
        self._await_query_id()
        started = time.monotonic()
        payloads = batch.toArrow()
        read = time.monotonic()
        groups = _by_table(payloads)
        entries = quarantine.read(self.quarantine_file)
        with ThreadPoolExecutor(max_workers=self.database.parallel_merges) as pool:
            results = list(pool.map(lambda item: self._apply(item[0], item[1], batch_id, entries), groups.items()))
        if self.spool is not None:  # every table's payloads are read; what is left is a failed attempt's
            self.spool.clear()
        failures = [(table, error) for table, error in results if error is not None]
        self._after_batch(batch_id, groups, failures, entries)
        merged = time.monotonic()
        self.committed_batches += 1
        metrics.BATCHES.labels(self.name, "committed" if groups else "empty").inc()
        metrics.LAST_BATCH.labels(self.name).set(batch_id)
        # Between two batches: Spark plans the next one (offsets, ranges, tasks) and waits for the trigger.
        between = "" if self._batch_ended is None else f"; {started - self._batch_ended:.2f}s since the last batch"
        self._batch_ended = merged
        log.info("database %s: batch %d -> %d table(s) (read+decode+reduce %.2fs, merge %.2fs)%s",
                 self.name, batch_id, len(groups), read - started, merged - read, between)

    def _apply(self, table: str, payloads: pa.Table, batch_id: int,
               entries: dict[str, dict[str, Any]]) -> tuple[str, BaseException | None]:
        """One table's part of the batch: bad records, then its MERGE unless already committed."""
        label = f"{self.name}.{table}"
        try:
            keys = pc.unique(payloads.column("primary_key")).to_pylist()
            if len(keys) > 1:
                raise DecodeError(f"database {self.name}, table {table}: the ranges of one batch name different "
                                  f"primary keys ({' / '.join(keys)})")
            topics = _topics(payloads)
            state = self._table(table, tuple(keys[0].split(",")), topics)
            prepared = batch_changes(payloads.select(["part", "payload"]))
            metrics.DECODE_ERRORS.labels(label).inc(prepared.failed.num_rows)
            handle_bad_records(label, prepared.failed, batch_id, self.dead_letters)
            # apply_typed checks the table's last batch first (one read of the Delta log) and skips a replay
            outcome = state.sink.apply_typed(prepared.changes, self.app_id(table), batch_id,
                                             truncate=prepared.truncated)
            if outcome.skipped_replay:
                metrics.BATCHES.labels(label, "replay_skipped").inc()
                return table, None
            state.committed_batches += 1
            state.last_outcome = outcome
            state.rows += prepared.count
            count_merged(label, outcome, prepared.count)
            state.maintenance.after_batch()
            if entries.get(table, {}).get("state") == quarantine.RESUMING:
                log.info("database %s: table %s resumed after quarantine", self.name, table)
            return table, None
        except BaseException as error:  # noqa: BLE001 - decided per table in `_after_batch`
            return table, error

    def _after_batch(self, batch_id: int, groups: dict[str, pa.Table], failures: list[tuple[str, BaseException]],
                     entries: dict[str, dict[str, Any]]) -> None:
        changed = False
        for table in list(entries):  # a resumed table whose batch is in: no entry any more
            if entries[table].get("state") == quarantine.RESUMING and table not in dict(failures):
                del entries[table]
                changed = True
        for table, error in failures:
            terminal = isinstance(error, TerminalError)
            if not terminal or self.database.on_table_error == "stop":
                if changed:
                    quarantine.write(self.quarantine_file, entries)
                raise error
        for table, error in failures:
            state = self.tables.get(table)
            topics = sorted(state.topics) if state is not None else _topics(groups[table])
            start = batch_start_offsets(self.checkpoint, batch_id) or {}
            previous = entries.get(table, {})
            offsets = previous.get("offsets") if previous.get("state") == quarantine.RESUMING else None
            entries[table] = {
                "state": quarantine.QUARANTINED, "reason": f"{type(error).__name__}: {error}", "batch_id": batch_id,
                "topics": topics, "offsets": offsets or {t: start.get(t, {}) for t in topics},
                "since": time.time(),
            }
            if state is not None:
                state.errors += 1
            metrics.QUARANTINED.labels(self.name, table).set(1)
            log.error("database %s: table %s quarantined at batch %d (the other tables go on): %s",
                      self.name, table, batch_id, error)
            changed = True
        if changed:
            quarantine.write(self.quarantine_file, entries)

    def start(self, until_idle: bool) -> StreamingQuery:
        """Start the streaming query; quarantined tables are tried again from where they stopped."""
        remove_abandoned_writes(self.checkpoint)
        check_routes(self.database, self.checkpoint)
        self._routes = stored_routes(self.checkpoint)
        entries = quarantine.read(self.quarantine_file)
        if entries:
            for table, entry in entries.items():
                entry["state"] = quarantine.RESUMING
                metrics.QUARANTINED.labels(self.name, table).set(0)
                log.info("database %s: table %s tried again from its quarantine offsets", self.name, table)
            quarantine.write(self.quarantine_file, entries)
        self._remove_spool()
        self.spool = payload_spool(self.spark.sparkContext.master or "", self.database.name)
        source = database_source(self.database, self.spark.sparkContext.defaultParallelism, self.spool)
        self.spark.dataSource.register(source)
        reader = (
            self.spark.readStream.format(database_source_name(self.database.name))
            .option("bootstrap.servers", self.settings.kafka.bootstrap_servers)
            .option("onDataLoss", self.database.on_data_loss)
            .option("startingOffsets", self.database.starting_offsets)
            .option("quarantineFile", self.quarantine_file)
            .option("minPartitions", str(self.spark.sparkContext.defaultParallelism))  # a large lone range in pieces
        )
        for key, value in self.settings.kafka.options.items():
            reader = reader.option(f"kafka.{key}", value)
        if self.database.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(self.database.max_offsets_per_trigger))
        writer = (
            reader.load().writeStream.queryName(self.database.name).outputMode("update")
            .foreachBatch(self.process_batch).option("checkpointLocation", self.checkpoint)
        )
        writer = with_trigger(writer, until_idle, self.settings.trigger_interval_seconds)
        self._query = self._start(writer)
        return self._query


    def close(self) -> None:
        """The query stopped: its spool goes."""
        self._remove_spool()

    def _remove_spool(self) -> None:
        if self.spool is not None:
            self.spool.remove()
            self.spool = None


def _by_table(payloads: pa.Table) -> dict[str, pa.Table]:
    """The batch's payload rows per table."""
    if payloads.num_rows == 0:
        return {}
    tables = payloads.column(TABLE_COLUMN)
    return {name: payloads.filter(pc.equal(tables, name)) for name in sorted(pc.unique(tables).to_pylist())}


def _topics(payloads: pa.Table) -> list[str]:
    return sorted(pc.unique(payloads.column("topic")).to_pylist())
