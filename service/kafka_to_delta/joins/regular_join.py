"""A regular changelog join (inner or left outer) as a Spark streaming query into a Delta table.

Data flow: both inputs' topics in one Kafka source -> decoded on the executors by each input's
decoder (`regular_join_source`) -> per micro-batch on the driver, in Arrow: bad records under their
policy, each side reduced to its last change per key, the join rules (`regular_join_rules`) applied
to the state (`join_state`, a Delta table inside the checkpoint) -> the output's net changes MERGEd
into the Delta table with the batch id as application transaction (`MergeSink`), then the state
committed with the same batch id. Why the join runs on the driver and not in Spark's state store:
docs/design/joins.md.
"""

from __future__ import annotations

import logging
import time

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from service.config.joins import RegularJoinSettings
from service.config.settings import Settings
from service.kafka_to_delta.joins.join_state import TIDY_EVERY_BATCHES, JoinStateStore, state_uri
from service.kafka_to_delta.joins.regular_join_rules import (
    JoinRules,
    JoinState,
    SideRules,
    Step,
    join_step,
    side_changes,
)
from service.kafka_to_delta.joins.regular_join_source import SIDE, sides_stream
from service.kafka_to_delta.materialize.rules import MaterializerConfig
from service.kafka_to_delta.rows.names import FAILED_COLUMNS, Column
from service.kafka_to_delta.sink.bad_records import handle_bad_records
from service.kafka_to_delta.sink.merge_sink import MergeOutcome
from service.kafka_to_delta.table_query import TableQuery
from service.observability import metrics
from service.runtime import test_hooks
from service.runtime.checkpoints import remove_abandoned_writes
from service.supervisor.batch_pipeline import with_trigger
from vocabulary import redaction
from vocabulary.changes import ChangeKind

log = logging.getLogger(__name__)
_CHANGE_KINDS = pa.array([kind.value for kind in ChangeKind])


def join_rules(join: RegularJoinSettings) -> JoinRules:
    """The rules' configuration of one join (TTLs as a plan or the config set them)."""
    return JoinRules(
        left=SideRules(join.left.primary_key, join.left.join_key, int(join.left_ttl_seconds * 1000)),
        right=SideRules(join.right.primary_key, join.right.join_key, int(join.right_ttl_seconds * 1000)),
        outer=join.type == "left",
        output=MaterializerConfig(table=join.table, primary_key=join.primary_key, on_conflict=join.on_conflict,
                                  log_values=redaction.log_values()),
        output_ttl_ms=int(join.state_ttl_seconds * 1000),
    )


class RegularJoinPipeline(TableQuery):
    """Runs one `RegularJoinSettings` as a streaming query into its Delta table."""

    def __init__(self, spark: SparkSession, settings: Settings, join: RegularJoinSettings) -> None:
        self._open_table(spark, settings, join.name, join.table, join.primary_key)
        self.join = join
        lakehouse = settings.lakehouse
        self.store = JoinStateStore(state_uri(settings.checkpoint_dir(join.name)), lakehouse.storage_options)
        self.rules = join_rules(join)
        self.state = JoinState()
        self.expired_rows = 0

    def _process_batch(self, batch: DataFrame, batch_id: int) -> None:
        test_hooks.hold_batch_if_armed(self.name, batch_id)
        self._await_query_id()
        started = time.monotonic()
        rows = batch.toArrow()
        errors = pc.is_valid(rows.column(Column.ERROR))
        handle_bad_records(self.name, rows.filter(errors).select(list(FAILED_COLUMNS)), batch_id, None)
        if self.store.committed(self.app_id, batch_id):
            log.info("join %s: batch %d already in Delta, skipped", self.name, batch_id)
            metrics.BATCHES.labels(self.name, "replay_skipped").inc()
            return
        changes = rows.filter(pc.and_(pc.invert(errors), pc.is_in(rows.column(Column.KIND), _CHANGE_KINDS)))
        side = changes.column(SIDE)
        step = join_step(self.state, side_changes(changes.filter(pc.equal(side, "left")), self.rules.left),
                         side_changes(changes.filter(pc.equal(side, "right")), self.rules.right), self.rules)
        outcome = self.sink.apply(step.output, self.app_id, batch_id)  # output first, then the state
        self.store.commit(step, self.app_id, batch_id)
        self.state = step.state
        if batch_id % TIDY_EVERY_BATCHES == TIDY_EVERY_BATCHES - 1:
            self.store.tidy()
        self._record(outcome, changes.num_rows, step)
        log.info("join %s: batch %d -> %s: %d changes read, %d upserts, %d deletes, %d expired (%.2fs)",
                 self.name, batch_id, self.table.uri, changes.num_rows, outcome.upserts, outcome.deletes,
                 step.expired, time.monotonic() - started)

    def _record(self, outcome: MergeOutcome, changes: int, step: Step) -> None:
        name = self.name
        self._count_merge(outcome, changes)
        self.expired_rows += step.expired
        metrics.CONFLICTS.labels(name, self.join.on_conflict).inc(step.counters.conflicts)
        metrics.ROLLBACKS.labels(name).inc(step.counters.rollbacks)
        metrics.CLEARED_STATE.labels(name).inc(step.counters.cleared_state_warnings)

    def start(self, until_idle: bool) -> StreamingQuery:
        """Start the streaming query; `until_idle` reads what is there now, then ends."""
        checkpoint = self.settings.checkpoint_dir(self.join.name)
        remove_abandoned_writes(checkpoint)
        self.state = self.store.load()  # as committed: a restart after a failure starts from there
        writer = (sides_stream(self.spark, self.settings, self.join)
                  .writeStream.queryName(self.join.name)
                  .foreachBatch(self.process_batch)
                  .option("checkpointLocation", checkpoint))
        writer = with_trigger(writer, until_idle, self.settings.trigger_interval_seconds)
        return self._start(writer)

    def close(self) -> None:
        """Nothing to release (the state is committed with every batch)."""
