"""What every streaming query that writes one Delta table shares (the ingest pipeline and both
joins): its table and MERGE sink, its name and application id, and the query id its batches
wait for before they commit."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from connectors.delta.engines import open_table
from service.config.choices import SchemaChanges
from service.config.settings import PipelineSettings, Settings
from service.kafka_to_delta.rows.names import Column
from service.kafka_to_delta.sink.column_rules import ColumnRules, ColumnRulesSink
from service.kafka_to_delta.sink.history_sink import HistoryOutcome, HistorySink
from service.kafka_to_delta.sink.merge_sink import MergeOutcome, MergeSink
from service.kafka_to_delta.source.history_rows import changelog_history
from service.observability import metrics
from service.supervisor.batch_pipeline import BatchPipeline, commit_app_id

log = logging.getLogger(__name__)
QUERY_ID_TIMEOUT_S = 60.0


def count_merged(name: str, outcome: MergeOutcome, changes: int) -> None:
    """The metrics of one micro-batch of a table whose net changes were merged, under the label `name`."""
    metrics.BATCHES.labels(name, "committed" if outcome.upserts + outcome.deletes else "empty").inc()
    metrics.CHANGES.labels(name).inc(changes)
    metrics.UPSERTS.labels(name).inc(outcome.upserts)
    metrics.DELETES.labels(name).inc(outcome.deletes)
    metrics.LAST_BATCH.labels(name).set(outcome.batch_id)


CHANGE_COLUMNS = (Column.TOPIC, Column.PARTITION, Column.OFFSET, Column.CHANGE_INDEX, Column.TIMESTAMP, Column.KIND,
                  Column.KEY, Column.ROW, Column.TYPES, Column.UNCHANGED, Column.SEQUENCE, Column.ERROR)
"""What a history needs of a batch's changelog rows on the decoded path."""


class HistoryWriter:
    """The history table of an ingest pipeline with `history:`: each micro-batch's row changes, committed
    after the current-row table's MERGE (a replay finds either commit done or not, each on its own).

    On the plain path the ranges hand the row changes over typed with their net changes
    (`BatchChanges.history`). Behind a stateful FROM_CHANGELOG stage (the decoded path) they are taken from
    the batch's changelog rows before the reduction (`changes`, typed on the driver)."""

    def __init__(self, spark: SparkSession, settings: Settings, pipeline: PipelineSettings) -> None:
        assert pipeline.history is not None
        lakehouse = settings.lakehouse
        uri = lakehouse.table_uri(pipeline.history.table_for(pipeline.table))
        table = open_table(lakehouse.engine, uri, lakehouse.storage_options, spark)
        self.primary_key = pipeline.primary_key
        self.sink = HistorySink(table, pipeline.primary_key, pipeline.history, pipeline.schema_changes)
        # A pipeline's kept and masked columns (`columns:` include / exclude / mask) hold for its history too.
        self.rules = (ColumnRules(spark, pipeline, pipeline.history.table_for(pipeline.table))
                      if pipeline.columns is not None else None)
        self.last_outcome: HistoryOutcome | None = None

    def changes(self, batch: DataFrame) -> pa.Table:
        """The decoded batch's row changes, typed; the batch is kept (persisted) for the reduction's action
        that follows, so the plan runs once (`release` when done)."""
        batch.persist()
        rows, _ = changelog_history(batch.select(*CHANGE_COLUMNS).toArrow(), self.primary_key)
        return rows

    def release(self, batch: DataFrame) -> None:
        """Drop the batch kept by `changes`."""
        batch.unpersist()

    def commit(self, rows: pa.Table | None, app_id: str, batch_id: int) -> None:
        """Bring the history table up to date with the batch's row changes, once per batch id."""
        started = time.monotonic()
        if rows is not None and self.rules is not None and not self.sink.already_committed(app_id, batch_id):
            rows = self.rules.apply_to_history(rows, self.sink.table.uri)
        outcome = self.last_outcome = self.sink.apply(rows, app_id, batch_id)
        if not outcome.skipped_replay:
            log.info("history %s: batch %d: %d key(s), %d row(s) written, %d removed (%.2fs)", self.sink.table.uri,
                     batch_id, outcome.keys, outcome.written, outcome.removed, time.monotonic() - started)


class QueryIdentity:
    """The id of a streaming query, which names its Delta commits: a micro-batch waits for it."""

    _query_id: str | None = None
    _started: threading.Event

    def _await_query_id(self) -> None:
        """Block a micro-batch until its query's id is known (it names the batch's commits)."""
        if not self._started.wait(QUERY_ID_TIMEOUT_S):
            raise RuntimeError("streaming query id not known")

    def _start(self, writer: Any) -> StreamingQuery:
        """Start the query `writer` describes; a restart by the runner waits for the new id."""
        self._started.clear()
        query = writer.start()
        self._query_id = str(query.id)
        self._started.set()
        return query


class TableQuery(QueryIdentity, BatchPipeline):
    """Base of a query into one Delta table; `_open_table` is called first by the constructor."""
    def _open_table(self, spark: SparkSession, settings: Settings, name: str, table: str,
                    primary_key: tuple[str, ...], schema_changes: SchemaChanges = "lenient") -> None:
        """Open the query's table and its MERGE sink (`schema_changes`: its policy for source schema
        changes); nothing committed, no query started yet."""
        self.spark = spark
        self.settings = settings
        self._query_name = name
        self._table_name = table
        lakehouse = settings.lakehouse
        shape = next((p.table_shape for p in settings.pipelines if (p.name, p.table) == (name, table)), None)
        self.table = open_table(lakehouse.engine, lakehouse.table_uri(table), lakehouse.storage_options, spark,
                                None if shape is None else shape.table_properties())
        self.sink = MergeSink(self.table, primary_key, schema_changes, shape=shape)
        columns = next((p for p in settings.pipelines if (p.name, p.table) == (name, table) and p.columns), None)
        if columns is not None:  # a pipeline's `columns:` (column_rules)
            self.sink = ColumnRulesSink(self.sink, ColumnRules(spark, columns, table))
        self.committed_batches = 0
        self.last_outcome: MergeOutcome | None = None
        self.failure: BaseException | None = None
        self._query_id: str | None = None
        self._started = threading.Event()

    @property
    def name(self) -> str:
        """The query's name (its pipeline's or join's)."""
        return self._query_name

    @property
    def app_id(self) -> str:
        """Application id of this query's Delta commits; the query id ties it to the checkpoint."""
        return commit_app_id(self._query_name, self._table_name, self._query_id)

    def _count_merge(self, outcome: MergeOutcome, changes: int) -> None:
        """Count a micro-batch whose net changes were merged (or found already merged)."""
        self.committed_batches += 1
        self.last_outcome = outcome
        count_merged(self._query_name, outcome, changes)
