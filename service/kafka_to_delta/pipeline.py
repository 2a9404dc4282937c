"""One ingest pipeline as a Spark streaming query: Kafka -> changelog -> net changes -> Delta MERGE.

The streaming plan, plain path (no materializer, no stateful FROM_CHANGELOG): each Kafka range
is read, decoded, reduced to its last change per key and typed where it is read
(`changes_source`, `partition_changes`); the driver merges the ranges in Arrow
(`batch_changes`) and MERGEs. With a history table, each range also hands over every row
change it read, typed (`history_rows`), which the history's commit takes after the MERGE.
Otherwise: each range is decoded where it is read as well (`decode_stage.DecodedRanges`
through `changes_source`: changelog rows, no raw records), the stateful FROM_CHANGELOG stage
when configured, then either the keyed-state materializer
(`materializer_stage`, when the upsert key differs from the primary key or several topics
feed the table) or, per micro-batch, the reduction in Spark (`net_changes`).

Per micro-batch (the barrier): apply the bad-record policies (FAIL stops before anything of
the batch is committed); skip the MERGE if Delta already holds the batch's commit (a replay
after a crash; the plan is still executed so the state store advances exactly as before);
MERGE with the batch id as the application transaction version. With `commits_behind` the MERGE
runs in the background while the next micro-batch's stages run, the batch's changes written ahead
into the checkpoint first (`sink/commits_behind.py`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import replace

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from service.config.settings import PipelineSettings, Settings
from service.kafka_to_delta.changelog.stage import stateful_changelog
from service.kafka_to_delta.materialize.bulk import DEFAULT_KEY_BUCKETS, StageConfig
from service.kafka_to_delta.materialize.net_changes import net_changes
from service.kafka_to_delta.materialize.payload import NetPayload
from service.kafka_to_delta.materialize.rules import MaterializerConfig
from service.kafka_to_delta.plan.rebuilt_seed import Seed, load_seed
from service.kafka_to_delta.plan.upgrades import stored_bucket_layout
from service.kafka_to_delta.rows.names import (
    COUNTERS,
    PACKED_SPARK_SCHEMA,
    PAYLOAD_COLUMN,
    PAYLOAD_SPARK_SCHEMA,
)
from service.kafka_to_delta.rows.payload_spool import PayloadSpool, payload_spool
from service.kafka_to_delta.rows.spark import STREAM_SPARK_SCHEMA
from service.kafka_to_delta.shape import Shape, pipeline_shape
from service.kafka_to_delta.sink.bad_records import DeadLetterStore, handle_bad_records
from service.kafka_to_delta.sink.commits_behind import FOLDER as AHEAD_FOLDER
from service.kafka_to_delta.sink.commits_behind import CommitsBehind, WrittenAhead, replay
from service.kafka_to_delta.sink.dead_letters import DeadLetterSink
from service.kafka_to_delta.sink.merge_sink import MergeOutcome, MergeSink
from service.kafka_to_delta.source.batch_changes import BatchChanges, batch_changes, join_ranges
from service.kafka_to_delta.source.bucket_packing import PackedBuckets
from service.kafka_to_delta.source.changes_source import changes_source, changes_source_name
from service.kafka_to_delta.source.decode_report import DecodeWays
from service.kafka_to_delta.source.decode_stage import DecodedRanges, batch_decoder
from service.kafka_to_delta.source.event_time_progress import EventTimeMaxima
from service.kafka_to_delta.source.piece_reducer import PieceReducer
from service.kafka_to_delta.table_query import HistoryWriter, TableQuery
from service.observability import metrics
from service.operations.maintenance import TableMaintenance
from service.runtime import test_hooks
from service.runtime.checkpoints import local_path, remove_abandoned_writes
from service.supervisor.batch_pipeline import commit_app_id, with_trigger
from vocabulary import redaction

log = logging.getLogger(__name__)


def app_id(pipeline: PipelineSettings, query_id: str | None) -> str:
    """Application id of a pipeline's Delta commits; the query id ties it to the checkpoint."""
    return commit_app_id(pipeline.name, pipeline.table, query_id)


def stage_config(pipeline: PipelineSettings, key_buckets: int = DEFAULT_KEY_BUCKETS,
                 spread: bool = True) -> StageConfig:
    """The materializer's configuration for one pipeline (`key_buckets`, `spread`: its checkpoint's state layout,
    as its plan decides it: `Shape.key_buckets`, `Shape.spread_buckets`)."""
    rules = MaterializerConfig(
        table=pipeline.table,
        primary_key=pipeline.primary_key,
        on_conflict=pipeline.on_conflict or "error",
        tombstone_retention_ms=int(pipeline.tombstone_retention_seconds * 1000),
        log_values=redaction.log_values(),
    )
    ttl_ms = int(pipeline.materializer_ttl_seconds * 1000)
    return StageConfig(
        rules=rules, compaction=pipeline.effective_compaction, state_ttl_ms=ttl_ms,
        whole_row_key=not pipeline.effective_upsert_key, key_buckets=key_buckets,
        spread_buckets=spread,
        row_digests=pipeline.one_live_row_per_key,
    )


def _net_written_ahead(ahead: WrittenAhead) -> pa.Table:
    """The net changes of a batch written ahead (its ranges' rows joined, where they were written unjoined)."""
    return ahead.changes if ahead.unjoined is None else join_ranges(ahead.changes, list(ahead.unjoined))


def _ranges_read(prepared: BatchChanges) -> str:
    """How many Kafka ranges (pieces of partitions) the plain path read in parallel, and how many of them were
    decoded in bulk, for the log."""
    ranges = prepared.vectorised + prepared.record_by_record
    return f" from {ranges} Kafka range(s) ({prepared.vectorised} in bulk)" if ranges else ""


class IngestPipeline(TableQuery):
    """Runs one `PipelineSettings` as a streaming query into its Delta table."""

    def __init__(self, spark: SparkSession, settings: Settings, pipeline: PipelineSettings) -> None:
        self._open_table(spark, settings, pipeline.name, pipeline.table, pipeline.primary_key, pipeline.schema_changes)
        self.pipeline = pipeline
        self.history = HistoryWriter(spark, settings, pipeline) if pipeline.history is not None else None
        self.maintenance = TableMaintenance(settings, pipeline, spark=spark)
        self.dead_letters: DeadLetterStore | None = None
        if pipeline.dead_letters is not None:
            sink = DeadLetterSink.for_pipeline(settings, pipeline.name, pipeline.dead_letters)
            self.dead_letters = lambda rows, batch_id: sink.store(rows, batch_id, app_id=self.app_id)
        self.materializer_totals: dict[str, int] = {}
        self.event_times = EventTimeMaxima(spark.sparkContext, self.progress_path)
        self.decode_ways = DecodeWays(spark.sparkContext)
        self._query: StreamingQuery | None = None
        self.shape: Shape = pipeline_shape(pipeline)  # the checkpoint's key bucket count is known at start
        self.seed: Seed | None = None
        self.commits: CommitsBehind | None = None
        self.spool: PayloadSpool | None = None  # the plain path's payloads handed over in files (local master)

    @property
    def progress_path(self) -> str:
        """Where the largest event time read per partition is handed to the source's planner."""
        return os.path.join(self.settings.checkpoint_dir(self.pipeline.name), "event_time_progress.json")

    def _source(self, format_name: str, watermarked: bool) -> DataFrame:
        """The pipeline's Kafka ranges, the largest cut in pieces until there is one per core (a topic
        of one partition, Debezium's default, is read and decoded on every core): every path's
        result is independent of where a partition's records were read (the plain path's driver
        merge fills unchanged columns across pieces; the stateful stages sort a key's rows by
        source position)."""
        pipeline = self.pipeline
        reader = (
            self.spark.readStream.format(format_name)
            .option("bootstrap.servers", self.settings.kafka.bootstrap_servers)
            .option("topics", ",".join(pipeline.topics))
            .option("onDataLoss", pipeline.on_data_loss)
        )
        if watermarked:  # per-partition event-time progress, for ORDER BY and the materializer
            reader = (reader.option("progressFile", self.progress_path)
                      .option("alignmentSlackMs", str(int(pipeline.effective_watermark_delay_seconds * 1000))))
            if pipeline.idle_timeout_seconds is not None:
                reader = reader.option("idleTimeoutMs", str(int(pipeline.idle_timeout_seconds * 1000)))
        for key, value in self.settings.kafka.options.items():
            reader = reader.option(f"kafka.{key}", value)
        starting = self.pipeline.starting_offsets if self.seed is None else self.seed.starting_offsets
        if not isinstance(starting, str):
            starting = json.dumps(starting)
        reader = reader.option("startingOffsets", starting)
        if self.pipeline.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(self.pipeline.max_offsets_per_trigger))
        reader = reader.option("minPartitions", str(self.spark.sparkContext.defaultParallelism))
        return reader.load()

    def _decoded_source(self, config: StageConfig | None) -> DataFrame:
        """The changes decoded where read: packed per key bucket when the bucket stage reads them
        directly, else one row per change through the stateful FROM_CHANGELOG stage (if any)."""
        name = changes_source_name(self.pipeline.name)
        if config is not None and self.shape.packed_buckets:
            # The bucket stage passes typed image columns on where it makes the driver's payload from a call's columns.
            typed = bool(self.shape.key_buckets) and config.decides_on_columns
            decoded = DecodedRanges(self.pipeline, self.event_times, bulk=True, ways=self.decode_ways, typed=typed)
            packed = PackedBuckets(decoded, config.key_buckets, config.bucket_labels)
            self.spark.dataSource.register(changes_source(self.pipeline.name, packed, PACKED_SPARK_SCHEMA))
            return self._source(name, watermarked=True)
        decoded = DecodedRanges(self.pipeline, self.event_times)
        self.spark.dataSource.register(changes_source(self.pipeline.name, decoded, STREAM_SPARK_SCHEMA))
        stream = self._source(name, watermarked=True)
        if not self.shape.changelog_stage:
            return stream
        return stateful_changelog(stream, self.pipeline, self.shape.watermark_compaction)

    def _prepared(self, batch: DataFrame, join: bool = True) -> BatchChanges:
        """The batch's changes; without `join`, its ranges' rows, joined at the commit (`BatchChanges.joined`)."""
        # Exactly one action on the batch: a second one would run the stateful plan again.
        if self.shape.reduces_where_read:
            found = batch_changes(batch.toArrow(), join)
            if self.spool is not None:  # the batch's payloads are read; what is left is a failed attempt's
                self.spool.clear()
            self._count_ranges(found)
            return found
        if PAYLOAD_COLUMN in batch.columns:  # the bucket materializer typed its own net rows
            payloads = batch
        else:
            net = net_changes(batch) if self.shape.reduces_per_batch else batch
            payloads = net.mapInArrow(NetPayload(self.pipeline.primary_key), PAYLOAD_SPARK_SCHEMA)
        found = batch_changes(payloads.toArrow(), join)
        self.event_times.flush()
        self._count_materializer(found.counters)
        if self.shape.packed_buckets:  # how the bucket stage's decode tasks went (`decode_report`)
            ways = self.decode_ways.take()
            found = replace(found, fallbacks=ways.get("fallbacks", []), vectorised=ways.get("vectorised", 0),
                            record_by_record=ways.get("record_by_record", 0), odd_records=ways.get("odd_records", 0))
            self._count_ranges(found)
        return found

    def _process_batch(self, batch: DataFrame, batch_id: int) -> None:
        test_hooks.hold_batch_if_armed(self.pipeline.name, batch_id)
        self._await_query_id()
        name = self.pipeline.name
        started = time.monotonic()
        if self.history is not None and not self.shape.reduces_where_read:  # behind a stateful stage
            history_rows = self.history.changes(batch)
            prepared = self._prepared(batch)
            self.history.release(batch)
        else:  # the ranges handed their row changes over (None without a history)
            # Behind the micro-batches, the join of the ranges (a partition read in pieces) runs in the commit.
            prepared = self._prepared(batch, join=self.commits is None)
            history_rows = prepared.history
        metrics.record_state(name, self._query.lastProgress if self._query is not None else None)
        metrics.DECODE_ERRORS.labels(name).inc(prepared.failed.num_rows)
        handle_bad_records(name, prepared.failed, batch_id, self.dead_letters)
        reduced = time.monotonic()
        if self.commits is None:
            self._commit(prepared, history_rows, batch_id, started, reduced)
            return
        ahead = WrittenAhead(batch_id, self.app_id, prepared.changes, prepared.truncated, prepared.truncates)
        self.commits.hand_over(ahead, lambda: self._commit(prepared, history_rows, batch_id, started, reduced))

    def _commit(self, prepared: BatchChanges, history_rows, batch_id: int, started: float, reduced: float) -> None:
        """The batch's MERGE (and its history's commit), unless Delta holds them; then the table's maintenance."""
        name = self.pipeline.name
        if self.sink.already_committed(self.app_id, batch_id) and (
                self.history is None or self.history.sink.already_committed(self.app_id, batch_id)):
            log.info("pipeline %s: batch %d already in Delta, skipped", name, batch_id)
            metrics.BATCHES.labels(name, "replay_skipped").inc()
            return
        committing = time.monotonic()
        prepared = prepared.joined()
        outcome = self.sink.apply_typed(prepared.changes, self.app_id, batch_id, truncate=prepared.truncated)
        if self.history is not None:
            self.history.commit(history_rows, self.app_id, batch_id)
        merged = time.monotonic()
        self._record(outcome, prepared.count, merged - committing, reduced - started)
        log.info(
            "pipeline %s: batch %d -> %s: %d upserts, %d deletes%s (read+decode+reduce %.2fs, merge %.2fs)",
            name, batch_id, self.table.uri, outcome.upserts, outcome.deletes, _ranges_read(prepared),
            reduced - started, merged - committing,
        )
        self.maintenance.after_batch()  # between this table's MERGEs: its commits never collide with them

    def _commits_behind(self, checkpoint: str) -> CommitsBehind | None:
        """The pipeline's commits behind its micro-batches (`commits_behind`), where they apply: a local
        checkpoint (the changes are written ahead there), the delta-rs engine (a commit outside Spark's
        jobs), no history table and no `columns:` rules (commits of one table by one sink)."""
        folder = local_path(checkpoint)
        if (not self.settings.commits_behind or folder is None or self.history is not None
                or self.settings.lakehouse.engine != "delta-rs" or type(self.sink) is not MergeSink):
            return None
        return CommitsBehind(folder / AHEAD_FOLDER, self.pipeline.name, self._failed_behind)

    def _failed_behind(self, error: BaseException) -> None:
        self.failed_behind = error

    def _replay_written_ahead(self, checkpoint: str) -> None:
        """Commit the batches a stopped run wrote ahead but may not have committed (before the query starts)."""
        folder = local_path(checkpoint)
        if folder is not None:
            replay(folder / AHEAD_FOLDER, self.pipeline.name,
                   lambda ahead: self.sink.apply_typed(_net_written_ahead(ahead), ahead.app_id, ahead.batch_id,
                                                       truncate=ahead.truncate))

    def settle_commits(self) -> None:
        """Wait for the commit behind the query (if any); its failure is kept in `failed_behind`."""
        if self.commits is not None:
            error = self.commits.settle()
            if error is not None and self.failed_behind is None:
                self.failed_behind = error

    def close(self) -> None:
        """The query stopped: let the commit behind it end (a failure leaves its batch written ahead)."""
        self.settle_commits()
        self._remove_spool()

    def _remove_spool(self) -> None:
        if self.spool is not None:
            self.spool.remove()
            self.spool = None

    def _count_ranges(self, found: BatchChanges) -> None:
        name = self.pipeline.name
        metrics.RANGES.labels(name, "vectorised").inc(found.vectorised)
        metrics.RANGES.labels(name, "record_by_record").inc(found.record_by_record)
        metrics.ODD_RECORDS.labels(name).inc(found.odd_records)
        if found.fallbacks:
            log.info("pipeline %s: %d Kafka range(s) decoded record by record, e.g. %s", name,
                     len(found.fallbacks), found.fallbacks[0])
        if found.odd_records:
            log.info("pipeline %s: %d record(s) of vectorised ranges decoded record by record", name,
                     found.odd_records)

    def _count_materializer(self, counters: dict[str, int]) -> None:
        if not self.shape.materializer or not counters:
            return
        name = self.pipeline.name
        total = {c: counters.get(c, 0) for c in COUNTERS}
        metrics.CONFLICTS.labels(name, self.pipeline.on_conflict or "error").inc(total["conflicts"])
        metrics.ROLLBACKS.labels(name).inc(total["rollbacks"])
        metrics.STALE_DROPPED.labels(name).inc(total["stale_dropped"])
        metrics.CLEARED_STATE.labels(name).inc(total["cleared_state_warnings"])
        self.materializer_totals = {k: self.materializer_totals.get(k, 0) + v for k, v in total.items()}

    def _record(self, outcome: MergeOutcome, changes: int, merge_s: float, reduce_s: float) -> None:
        name = self.pipeline.name
        self._count_merge(outcome, changes)
        metrics.STAGE_SECONDS.labels(name, "read_decode_reduce").observe(reduce_s)
        metrics.STAGE_SECONDS.labels(name, "merge").observe(merge_s)

    def start(self, until_idle: bool) -> StreamingQuery:
        """Start the streaming query; `until_idle` reads what is there now, then ends."""
        checkpoint = self.settings.checkpoint_dir(self.pipeline.name)
        remove_abandoned_writes(checkpoint)
        self._replay_written_ahead(checkpoint)
        if self.commits is not None:  # a restart: the previous run's commits ended as its query stopped
            self.commits.close()
        self.commits = self._commits_behind(checkpoint)
        self.failed_behind = None
        self.seed = load_seed(self.spark, checkpoint)  # rebuild-state
        self.shape = pipeline_shape(self.pipeline, *stored_bucket_layout(self.pipeline.name, checkpoint))
        config = stage_config(self.pipeline, self.shape.key_buckets, self.shape.spread_buckets) \
            if self.shape.materializer else None
        if self.shape.reduces_where_read:
            self._remove_spool()
            self.spool = payload_spool(self.spark.sparkContext.master, self.pipeline.name)
            reducer = PieceReducer(batch_decoder(self.pipeline), self.pipeline.primary_key,
                                   history=self.pipeline.history_sequence_by, spool=self.spool)
            self.spark.dataSource.register(changes_source(self.pipeline.name, reducer))
            stream = self._source(changes_source_name(self.pipeline.name), watermarked=False)
        else:  # decoded where read as well: changelog rows and watermark candidates
            stream = self._decoded_source(config)
        if config is not None:
            # Imported here: the materializer needs pandas (50 MiB) that the plain path does not.
            from service.kafka_to_delta.materialize.key_stage import materialize

            stream = materialize(
                stream, config, self.pipeline.effective_watermark_delay_seconds,
                declare_watermark=self.shape.materializer_declares_watermark,
                initial_state=None if self.seed is None else self.seed.initial_state,
                payload_key=self.pipeline.primary_key if self.shape.key_buckets else None,
            )
        writer = (
            stream
            .writeStream.queryName(self.pipeline.name)
            .outputMode("update")
            .foreachBatch(self.process_batch)
            .option("checkpointLocation", checkpoint)
        )
        writer = with_trigger(writer, until_idle, self.settings.trigger_interval_seconds)
        query = self._start(writer)
        self._query = query
        return query
