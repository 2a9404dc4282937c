"""The keyed-state materializer inside Spark: `transformWithState` over the sink primary key.

The rules live in `service.kafka_to_delta.materialize.rules` (pure Python); this module only moves
rows between Spark and those rules and keeps each key's state in the RocksDB state store, so
the state is checkpointed with the query and scales with Spark partitions.

Barriers (`compaction`):
- `batch`: every micro-batch is a barrier; a key's changes in the batch are applied in
  arrival order (Kafka timestamp, then topic, partition, offset, change index) and collapse
  into one net change.
- `watermark`: a change waits in state until the event-time watermark (the largest event time
  of the earlier micro-batches, minus the configured delay) has reached it; then every waiting
  change of the key up to the watermark collapses, in arrival order, into one net change. The
  event time is the change's own (FROM_CHANGELOG `order_by`), else its Kafka timestamp: the two
  halves of one source transaction share it, so a barrier never falls between them as long as
  no partition lags the others by more than the delay. A change that arrives already behind
  the watermark is not dropped: it is applied at once, together with whatever of its key is due.

State TTL (`state_ttl_ms`) counts in the same event time: a key's state is dropped once the
watermark passes the event time of its last applied change plus the TTL (a later retraction of
it then finds nothing and is logged, never fatal). Tombstones of sequence_by follow their own
retention, in the same event time (the largest event time of the changes compacted with the delete,
and later ones), and are pruned when the key is next touched. No decision reads the wall clock, so a
micro-batch replayed after a crash yields exactly the same state and output.

Every compaction emits one row for the key (kind null when nothing changes) carrying the counters
and the number of changes it applied. Rows that failed earlier stages pass through untouched
(each under a key of its own), so the driver sees them with the net changes of the same batch.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Iterable, Iterator

from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import LongType, StringType, StructField, StructType

from service.kafka_to_delta.barrier import outlived, released
from service.kafka_to_delta.materialize.bucket_stage import BucketProcessor, bucketed, bucketed_seed
from service.kafka_to_delta.materialize.bulk import (
    ERROR_PREFIX,
    StageConfig,
    arrival,
    compact_key,
    is_failed,
    passthrough,
)
from service.kafka_to_delta.materialize.rules import Materializer
from service.kafka_to_delta.rows.names import (
    BUCKET,
    EVENT_TIME,
    GROUP,
    PACKED_CHANGES,
    PACKED_NET_SPARK_SCHEMA,
    PAYLOAD_SPARK_SCHEMA,
    STAGE_FIELDS,
    WATERMARK_COLUMN,
)
from service.kafka_to_delta.rows.spark import NET_SCHEMA
from service.runtime.worker_heap import task_started

__all__ = ["MaterializerProcessor", "StageConfig", "grouped_changes", "materialize", "time_mode", "waiting_item"]

_WATERMARK_COLUMN = "_event_ts"
_STATE_SCHEMA = StructType([StructField("state", StringType()), StructField("touched", LongType())])
_WAITING_FIELDS = (
    ("kind", StringType()), ("upsert_key", StringType()), ("row", StringType()), ("types", StringType()),
    ("unchanged", StringType()), ("sequence", StringType()), (EVENT_TIME, LongType()),
    ("topic", StringType()), ("partition", LongType()), ("offset", LongType()), ("change_index", LongType()),
    ("timestamp", LongType()),
)
_WAITING_SCHEMA = StructType([StructField(name, kind) for name, kind in _WAITING_FIELDS])
_WAITING_NAMES = tuple(name for name, _ in _WAITING_FIELDS)
_event_time = itemgetter(EVENT_TIME)


def waiting_item(record: dict) -> tuple:
    """A changelog record as an item of the `waiting` list state."""
    return tuple(record.get(name) for name in _WAITING_NAMES)


def _passthrough(rows: Iterable[Row]) -> Iterator[Row]:
    for values in passthrough(row.asDict() for row in rows):
        yield Row(**values)


class MaterializerProcessor(StatefulProcessor):
    """Applies the rules per primary key; state: the rules' state text (with the event time it was last
    touched at, for the TTL) and, under watermark compaction, the waiting changes."""

    def __init__(self, config: StageConfig) -> None:
        self.config = config

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the state variables."""
        task_started()
        self.handle = handle
        self.rules = Materializer(self.config.rules)
        self.state = handle.getValueState("rules", _STATE_SCHEMA)
        if self.config.compaction == "watermark":
            self.waiting = handle.getListState("waiting", _WAITING_SCHEMA)

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: TimerValues) -> Iterator[Row]:
        """Compact the key's changes of this micro-batch (batch), or those the watermark reached."""
        group = key[0]
        if is_failed(group):
            yield from _passthrough(rows)
            return
        records = sorted((row.asDict() for row in rows), key=arrival)
        if self.config.compaction == "watermark":
            records = self._due(records, timerValues.getCurrentWatermarkInMs())
        if records:
            yield self._compact(group, records)

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues, expiredTimerInfo: Any) -> Iterator[Row]:
        """Compact what the watermark reached; then drop the state if it outlived the TTL."""
        watermark = timerValues.getCurrentWatermarkInMs()
        if self.config.compaction == "watermark":
            due = self._due([], watermark)
            if due:
                yield self._compact(key[0], due)
        if self.config.state_ttl_ms:
            stored = self.state.get()
            if stored is not None and outlived(stored[1], self.config.state_ttl_ms, watermark):
                self.state.clear()

    def _due(self, arrived: list[dict], watermark: int) -> list[dict]:
        """The waiting and arrived changes the watermark reached, in arrival order; the rest wait."""
        waiting = [dict(zip(_WAITING_NAMES, item)) for item in self.waiting.get()]
        due, still = released(waiting, watermark, _event_time)
        due_now, later = released(arrived, watermark, _event_time)
        due += due_now
        if len(still) == len(waiting):
            if later:
                self.waiting.appendList([waiting_item(r) for r in later])
        elif still or later:
            self.waiting.put([waiting_item(r) for r in still + later])
        else:
            self.waiting.clear()
        for event_time in sorted({r[EVENT_TIME] for r in later}):
            self.handle.registerTimer(int(event_time))
        return sorted(due, key=arrival)

    def _compact(self, group: str, records: list[dict]) -> Row:
        stored = self.state.get()
        ttl_ms = self.config.state_ttl_ms
        net, kept = compact_key(self.rules, group, records, stored, self.config.whole_row_key, ttl_ms,
                                self.config.row_digests)
        if kept is None:
            if stored is not None:
                self.state.clear()
        elif ttl_ms:
            self._touch(kept, None if stored is None else stored[1])
        elif stored is None or kept[0] != stored[0]:
            self.state.update(kept)
        return Row(**net)

    def _touch(self, kept: tuple, touched: int | None) -> None:
        # One TTL timer per key: the one at (last touched + TTL).
        latest = kept[1]
        if touched is not None and latest != touched:
            self.handle.deleteTimer(touched + self.config.state_ttl_ms)
        if latest != touched:
            self.handle.registerTimer(latest + self.config.state_ttl_ms)
        self.state.update(kept)

    def close(self) -> None:
        """Nothing to release."""


def time_mode(config: StageConfig) -> str:
    """Event time when changes wait for the watermark or the state has a TTL; else none (no timers).

    Spark's own state TTL needs processing time, and a processing-time operator makes a micro-batch
    on every trigger even without data (so `availableNow` never ends): the TTL is kept here instead,
    in event time, with one timer per key.
    """
    return "EventTime" if config.compaction == "watermark" or config.state_ttl_ms else "None"


def grouped_changes(changelog: DataFrame) -> DataFrame:
    """Changelog rows with their group key (`GROUP`: the primary key, or a failed row's own) and event time
    (FROM_CHANGELOG's, else the Kafka record's)."""
    group = F.when(F.col("error").isNull(), F.col("key")).otherwise(
        F.concat(F.lit(ERROR_PREFIX), F.concat_ws(":", "topic", "partition", "offset"))
    )
    event_time = F.coalesce(F.col(EVENT_TIME), F.col("timestamp"))
    return changelog.withColumn(GROUP, group).withColumn(EVENT_TIME, event_time)


def materialize(
    changelog: DataFrame, config: StageConfig, watermark_delay_seconds: float = 0.0, declare_watermark: bool = True,
    initial_state: DataFrame | None = None, payload_key: tuple[str, ...] | None = None,
) -> DataFrame:
    """Net changes per primary key through the keyed-state materializer: state per key bucket
    (`materializer_buckets`, the default; its rows are packed, `PACKED_NET_SPARK_SCHEMA`, read them
    with `net_changes.unpack_net`) or, with `key_buckets` 0, per key (`MaterializerProcessor`, NET_SCHEMA).

    `payload_key` (the table's primary key; bucket stage only): the bucket stage emits the driver's
    payload rows (`PAYLOAD_SPARK_SCHEMA`, `payload.net_payload`) instead of packed net rows.

    `initial_state` (`materializer_buckets.SEED_SCHEMA`, bucket stage only): the state the first
    micro-batch of a fresh checkpoint starts from (`service.kafka_to_delta.plan.state_rebuild`).

    `changelog` is one row per change, or changes already packed per key bucket where they were
    decoded (`bucket_packing.PACKED_SPARK_SCHEMA`, bucket stage only).

    In event time the watermark is declared on a column that is dropped before the stateful
    operator: the query's watermark still advances (and fires the timers), but Spark does not
    filter "late" rows out of the operator's input, which would silently lose changes.
    """
    packed = PACKED_CHANGES in changelog.columns
    if packed and not config.key_buckets:
        raise ValueError("changes packed per key bucket need the bucket stage (key_buckets > 0)")
    grouped = changelog if packed else grouped_changes(changelog)
    mode = time_mode(config)
    # A stateful FROM_CHANGELOG stage in front declares the query's one watermark: a second
    # declaration would keep its buffered rows from ever being released.
    if mode == "EventTime" and declare_watermark:
        delay_ms = int(watermark_delay_seconds * 1000) if config.compaction == "watermark" else 0
        # The decode stage's candidate when there is one: the same event time, combined over partitions.
        moment = F.col(WATERMARK_COLUMN) if WATERMARK_COLUMN in changelog.columns else F.col(EVENT_TIME)
        grouped = grouped.withColumn(_WATERMARK_COLUMN, F.timestamp_millis(moment)).withWatermark(
            _WATERMARK_COLUMN, f"{delay_ms} milliseconds"
        )
    if packed:
        stage_input = grouped.select(BUCKET, PACKED_CHANGES)
    else:
        carried = grouped.select(*STAGE_FIELDS)
        if not config.key_buckets:
            if initial_state is not None:
                raise ValueError("an initial state needs the bucket stage (key_buckets > 0)")
            return carried.groupBy(GROUP).transformWithState(MaterializerProcessor(config), NET_SCHEMA, "Update", mode)
        stage_input = bucketed(carried, config.key_buckets, config.bucket_labels)
    seeded = None if initial_state is None else bucketed_seed(
        initial_state, config.key_buckets, config.bucket_labels).groupBy(BUCKET)
    schema = PACKED_NET_SPARK_SCHEMA if payload_key is None else PAYLOAD_SPARK_SCHEMA
    return stage_input.groupBy(BUCKET).transformWithStateInPandas(
        BucketProcessor(config, payload_key), schema, "Update", mode, initialState=seeded
    )
