"""The snapshot-gated processing-time enrichment join as a Spark streaming query
(docs/design/joins-enrichment.md).

One query reads the topics of both inputs (the project's Kafka source); each micro-batch is
handled on the driver, in Arrow:
1. the gate: its state after the previous batch, advanced by what this batch read of the build
   input (`snapshot_gate`), kept in the checkpoint unless unchanged (a replay reuses it);
2. the build changes of the batch, applied to the build state (latest row per join key);
3. gate closed: the batch's probe records are added to the held records, nothing is output;
   gate open: the held records (the batch that opened it) and the batch's probe records are
   joined with the build state as it is now, so within a batch build changes come first;
   missing build rows follow `missing`; the result is MERGEd into the Delta table with the
   batch id as application transaction; then the held records are cleared.
Every write is skipped when the batch already made it, so a replayed batch changes nothing.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable

import pyarrow as pa
from prometheus_client import Counter, Gauge
from pyarrow import fs
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from connectors.kafka import offsets as om
from connectors.kafka.cluster import ClusterView
from connectors.kafka.range_reader import RAW_SCHEMA
from service.config.dead_letters import DeadLetterSettings
from service.config.joins import EnrichmentJoinSettings
from service.config.settings import Settings
from service.kafka_to_delta.joins.enrichment_rows import (
    Enriched,
    build_changes,
    enrich,
    good_rows,
    probe_keys,
)
from service.kafka_to_delta.joins.enrichment_state import BuildState, GateLog, HeldProbes
from service.kafka_to_delta.joins.join_inputs import decode_records, input_decoder, side_records
from service.kafka_to_delta.joins.join_source import join_records
from service.kafka_to_delta.joins.snapshot_gate import BuildObservations, GateState
from service.kafka_to_delta.rows.names import Column
from service.kafka_to_delta.sink.bad_records import failed_rows, handle_bad_records
from service.kafka_to_delta.sink.dead_letters import DeadLetterSink
from service.kafka_to_delta.table_query import TableQuery
from service.observability import metrics
from service.runtime.checkpoints import remove_abandoned_writes
from service.supervisor.batch_pipeline import with_trigger

log = logging.getLogger(__name__)
MISSING = Counter("cdc_enrichment_missing", "Probe records that found no build row, by policy",
                  metrics.PIPELINE + ("policy",))
HELD = Gauge("cdc_enrichment_held_probes", "Probe records held back while the snapshot gate is closed",
             metrics.PIPELINE)
GATE_OPEN = Gauge("cdc_enrichment_gate_open", "1 once the build input's snapshot phase is complete", metrics.PIPELINE)
MISSING_STAGE = "enrichment"


def batch_end_offsets(checkpoint: str, batch_id: int) -> dict[tuple[str, int], int]:
    """The end offset per partition of micro-batch `batch_id`, from the checkpoint's offset log
    (written by Spark before the batch runs; line 3 is the source's offset)."""
    filesystem, root = fs.FileSystem.from_uri(checkpoint if "://" in checkpoint else os.path.abspath(checkpoint))
    with filesystem.open_input_stream(f"{root}/offsets/{batch_id}") as stream:
        lines = stream.read().decode("utf-8").splitlines()
    return om.from_map(json.loads(lines[2]))


class EnrichmentJoinPipeline(TableQuery):
    """Runs one `EnrichmentJoinSettings` as a streaming query into its Delta table."""

    def __init__(self, spark: SparkSession, settings: Settings, join: EnrichmentJoinSettings) -> None:
        self._open_table(spark, settings, join.name, join.table, join.primary_key)
        self.join = join
        lakehouse = settings.lakehouse
        self.checkpoint = settings.checkpoint_dir(join.name)
        state_root = f"{self.checkpoint}/enrichment"
        options = dict(lakehouse.storage_options)
        self.build = BuildState(f"{state_root}/build", options)
        self.held = HeldProbes(f"{state_root}/held", options)
        self.gate_log = GateLog(f"{state_root}/gate", options)
        self.probe_decoder = input_decoder(join.left)
        self.build_decoder = input_decoder(join.right)
        self.dead_letters: DeadLetterSink | None = None
        if join.missing == "dead_letter":
            assert join.dead_letter_topic is not None  # the settings check it
            self.dead_letters = DeadLetterSink(DeadLetterSettings(topic=join.dead_letter_topic), join.name,
                                               kafka_config=settings.kafka.client_config())
        self.gate = GateState()
        self.clock: Callable[[], float] = time.time  # processing time, seconds (the build state's TTL)
        self.missing_total = 0

    def _end_offsets(self, topic: str) -> dict[int, int]:
        cluster = ClusterView(self.settings.kafka.client_config())
        try:
            return {p: high for (_, p), (_, high) in cluster.watermarks(cluster.partitions([topic])).items()}
        finally:
            cluster.close()

    def _advance_gate(self, build: pa.Table, batch_id: int) -> GateState:
        before, written = self.gate_log.state_for(batch_id)
        if written or before.open:
            return before
        ends = {tp: end for tp, end in batch_end_offsets(self.checkpoint, batch_id).items()
                if tp[0] in self.join.right.topics}
        decoded = good_rows(build)
        markers = zip(zip(decoded.column(Column.TOPIC).to_pylist(), decoded.column(Column.PARTITION).to_pylist()),
                      decoded.column(Column.SNAPSHOT).to_pylist())
        after = before.advanced(batch_id, self.join.right.topics, BuildObservations(ends, list(markers)),
                                self._end_offsets)
        if after != before:
            self.gate_log.record(after, batch_id)
        if after.open:
            log.info("join %s: snapshot gate opened in batch %d", self.name, batch_id)
        else:
            log.info("join %s: batch %d: snapshot gate closed, waiting for %s", self.name, batch_id,
                     ", ".join(after.waiting_for(self.join.right.topics)))
        return after

    def _process_batch(self, batch: DataFrame, batch_id: int) -> None:
        self._await_query_id()
        raw = batch.toArrow().select(RAW_SCHEMA.names).cast(RAW_SCHEMA)  # the only action on the batch
        build = decode_records(side_records(raw, self.join.right), self.build_decoder)
        handle_bad_records(self.name, failed_rows(build), batch_id, None)
        probe_records = side_records(raw, self.join.left)
        if self.join.gate:
            self.gate = self._advance_gate(build, batch_id)
            GATE_OPEN.labels(self.name).set(1 if self.gate.open else 0)
        now_ms = int(self.clock() * 1000)
        self.build.apply(build_changes(build, self.join.right.join_key), batch_id, now_ms)
        live_since = self.live_since(now_ms)
        if live_since is not None:  # reads skip expired rows; they are removed here
            self.build.expire(live_since, batch_id)
        if self.join.gate and not self.gate.open:
            self.held.hold(probe_records, batch_id)
            HELD.labels(self.name).set(self.held.count())
            self.committed_batches += 1  # into the state: progress, as far as restarts are counted
            metrics.BATCHES.labels(self.name, "held").inc()
            return
        if self.join.gate and self.gate.opened_in_batch == batch_id:
            probe_records = pa.concat_tables([self.held.all(), probe_records])  # held ones first: read earlier
        self._emit(probe_records, batch_id, now_ms)
        if self.join.gate and self.gate.opened_in_batch == batch_id:
            self.held.clear(batch_id)  # after the output commit: a crash in between replays both
            HELD.labels(self.name).set(0)

    def live_since(self, now_ms: int) -> int | None:
        """The oldest write time of a build row still alive (`state_ttl_seconds`; None: no TTL)."""
        ttl_ms = int(self.join.state_ttl_seconds * 1000)
        return now_ms - ttl_ms if ttl_ms > 0 else None

    def _emit(self, probe_records: pa.Table, batch_id: int, now_ms: int) -> None:
        probes = decode_records(probe_records, self.probe_decoder)
        handle_bad_records(self.name, failed_rows(probes), batch_id, None)
        rows = self.build.rows(probe_keys(probes, self.join.left.join_key), self.live_since(now_ms))
        enriched = enrich(probes, rows, self.join.left.join_key, self.join.primary_key,
                          emit_missing=self.join.missing == "nulls")
        self._missing(enriched, probe_records, batch_id)
        outcome = self.sink.apply(enriched.net, self.app_id, batch_id)
        self.committed_batches += 1
        metrics.BATCHES.labels(self.name, "replay_skipped" if outcome.skipped_replay else "committed").inc()
        metrics.UPSERTS.labels(self.name).inc(outcome.upserts)
        metrics.DELETES.labels(self.name).inc(outcome.deletes)
        metrics.LAST_BATCH.labels(self.name).set(batch_id)
        log.info("join %s: batch %d -> %s: %d upserts, %d deletes (%d probe rows joined, %d missing: %s)",
                 self.name, batch_id, self.table.uri, outcome.upserts, outcome.deletes, enriched.joined,
                 enriched.missing.num_rows, self.join.missing)

    def _missing(self, enriched: Enriched, records: pa.Table, batch_id: int) -> None:
        count = enriched.missing.num_rows
        if not count:
            return
        self.missing_total += count
        MISSING.labels(self.name, self.join.missing).inc(count)
        if self.dead_letters is None:
            return
        coordinates = (Column.TOPIC, Column.PARTITION, Column.OFFSET)
        where = set(zip(*(enriched.missing.column(c).to_pylist() for c in coordinates)))
        letters = records.filter(pa.array([tpo in where for tpo in zip(*(records.column(c).to_pylist()
                                                                          for c in coordinates))], pa.bool_()))
        letters = letters.rename_columns({"key": "raw_key", "value": "raw_value"})
        n = letters.num_rows
        letters = letters.append_column("stage", pa.array([MISSING_STAGE] * n, pa.string()))
        letters = letters.append_column("error", pa.array(["no build row for the join key"] * n, pa.string()))
        self.dead_letters.store(letters, batch_id, app_id=f"{self.app_id}/missing")

    def start(self, until_idle: bool) -> StreamingQuery:
        """Start the streaming query; `until_idle` reads what is there now, then ends."""
        remove_abandoned_writes(self.checkpoint)
        writer = (
            join_records(self.spark, self.settings, self.join).writeStream.queryName(self.join.name)
            .foreachBatch(self.process_batch)
            .option("checkpointLocation", self.checkpoint)
        )
        writer = with_trigger(writer, until_idle, self.settings.trigger_interval_seconds)
        return self._start(writer)

    def close(self) -> None:
        """Release the dead-letter producer, if any."""
        if self.dead_letters is not None:
            self.dead_letters.close()
