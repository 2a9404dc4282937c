"""One ingest pipeline as a Spark streaming query: Kafka -> decode -> net changes -> Delta MERGE.

Per micro-batch (the barrier): skip it if Delta already holds its commit (replay after a
crash); decode on the executors; reduce to one net change per key; stop on the first
record that failed to decode (nothing of the batch is committed, its offsets are not
marked done, so a restart meets the same record); MERGE with the batch id as the
application transaction version.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from functools import partial
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming import StreamingQuery

from connectors.delta.delta_rs import DeltaRsTable
from connectors.kafka.source import FORMAT_NAME, KafkaSource
from service import metrics
from service.errors import DecodeError, SourceCoordinates
from service.kafka_to_delta.debezium_json import DECODED_SCHEMA, decode_batch
from service.kafka_to_delta.merge_sink import MergeOutcome, MergeSink
from service.kafka_to_delta.net_changes import CHANGES_COLUMN, net_changes
from service.settings import PipelineSettings, Settings

log = logging.getLogger(__name__)
_DECODED_SPARK_SCHEMA = from_arrow_schema(DECODED_SCHEMA)
_QUERY_ID_TIMEOUT_S = 60.0


def _decode_partition(primary_key: tuple[str, ...], batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield decode_batch(batch, primary_key)


def app_id(pipeline: PipelineSettings, query_id: str | None) -> str:
    """Application id of a pipeline's Delta commits; the query id ties it to the checkpoint."""
    return f"cdc-lakehouse/{pipeline.name}/{pipeline.table}/{query_id}"


def raise_first_error(net: pa.Table) -> None:
    """Stop at the earliest record (topic, partition, offset) that failed to decode."""
    failed = net.filter(pc.is_valid(net.column("error")))
    if failed.num_rows == 0:
        return
    first = min(failed.to_pylist(), key=lambda r: (r["topic"], r["partition"], r["offset"]))
    where = SourceCoordinates(first["topic"], first["partition"], first["offset"], first["key"])
    more = f"; {failed.num_rows - 1} more bad record(s) in this batch" if failed.num_rows > 1 else ""
    raise DecodeError(first["error"] + more, where)


class IngestPipeline:
    """Runs one `PipelineSettings` as a streaming query into its Delta table."""

    def __init__(self, spark: SparkSession, settings: Settings, pipeline: PipelineSettings) -> None:
        self.spark = spark
        self.settings = settings
        self.pipeline = pipeline
        self.table = DeltaRsTable(settings.lakehouse.table_uri(pipeline.table), settings.lakehouse.storage_options)
        self.sink = MergeSink(self.table, pipeline.primary_key)
        self.committed_batches = 0
        self.last_outcome: MergeOutcome | None = None
        self.failure: BaseException | None = None
        self._query_id: str | None = None
        self._started = threading.Event()

    @property
    def app_id(self) -> str:
        """Application id of this pipeline's Delta commits."""
        return app_id(self.pipeline, self._query_id)

    def _source(self) -> DataFrame:
        reader = (
            self.spark.readStream.format(FORMAT_NAME)
            .option("bootstrap.servers", self.settings.kafka.bootstrap_servers)
            .option("topics", ",".join(self.pipeline.topics))
        )
        for key, value in self.settings.kafka.options.items():
            reader = reader.option(f"kafka.{key}", value)
        starting = self.pipeline.starting_offsets
        if not isinstance(starting, str):
            starting = json.dumps(starting)
        reader = reader.option("startingOffsets", starting)
        if self.pipeline.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(self.pipeline.max_offsets_per_trigger))
        return reader.load()

    def process_batch(self, raw: DataFrame, batch_id: int) -> None:
        """One micro-batch; a failure is kept so the runner can report it as raised."""
        try:
            self._process_batch(raw, batch_id)
        except BaseException as error:
            self.failure = error
            raise

    def _process_batch(self, raw: DataFrame, batch_id: int) -> None:
        if not self._started.wait(_QUERY_ID_TIMEOUT_S):
            raise RuntimeError("streaming query id not known")
        name = self.pipeline.name
        if self.sink.already_committed(self.app_id, batch_id):
            log.info("pipeline %s: batch %d already in Delta, skipped", name, batch_id)
            metrics.BATCHES.labels(name, "replay_skipped").inc()
            return
        started = time.monotonic()
        decoder = partial(_decode_partition, self.pipeline.primary_key)
        net = net_changes(raw.mapInArrow(decoder, _DECODED_SPARK_SCHEMA)).toArrow()
        metrics.DECODE_ERRORS.labels(name).inc(net.num_rows - net.column("error").null_count)
        raise_first_error(net)
        reduced = time.monotonic()
        outcome = self.sink.apply(net, self.app_id, batch_id)
        merged = time.monotonic()
        self._record(outcome, pc.sum(net.column(CHANGES_COLUMN)).as_py() or 0, merged - reduced, reduced - started)
        log.info(
            "pipeline %s: batch %d -> %s: %d upserts, %d deletes (read+decode+reduce %.2fs, merge %.2fs)",
            name, batch_id, self.table.uri, outcome.upserts, outcome.deletes, reduced - started, merged - reduced,
        )

    def _record(self, outcome: MergeOutcome, changes: int, merge_s: float, reduce_s: float) -> None:
        name = self.pipeline.name
        self.committed_batches += 1
        self.last_outcome = outcome
        metrics.BATCHES.labels(name, "committed" if outcome.upserts + outcome.deletes else "empty").inc()
        metrics.CHANGES.labels(name).inc(changes)
        metrics.UPSERTS.labels(name).inc(outcome.upserts)
        metrics.DELETES.labels(name).inc(outcome.deletes)
        metrics.LAST_BATCH.labels(name).set(outcome.batch_id)
        metrics.STAGE_SECONDS.labels(name, "read_decode_reduce").observe(reduce_s)
        metrics.STAGE_SECONDS.labels(name, "merge").observe(merge_s)

    def start(self, until_idle: bool) -> StreamingQuery:
        """Start the streaming query; `until_idle` reads what is there now, then ends."""
        self.spark.dataSource.register(KafkaSource)
        writer = (
            self._source()
            .writeStream.queryName(self.pipeline.name)
            .foreachBatch(self.process_batch)
            .option("checkpointLocation", self.settings.checkpoint_dir(self.pipeline.name))
        )
        if until_idle:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{self.settings.trigger_interval_seconds} seconds")
        query = writer.start()
        self._query_id = str(query.id)
        self._started.set()
        return query
