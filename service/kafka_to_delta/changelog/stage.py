"""The stateful part of FROM_CHANGELOG inside Spark: ORDER BY event time, then upsert unzip, then
compaction of each released window (spec 4.1.2.2, 4.3.2, 4.3.3, 4.4).

One `transformWithState` operator grouped by (topic, partition key), in event-time mode. Per
group and micro-batch, in this order:
- ORDER BY (`order_by`): rows wait in state (`EventTimeBuffer`) until the watermark (largest
  event time of the earlier micro-batches minus `watermark_delay_seconds`) reaches them, then
  leave in event-time order. A row already behind the watermark when it arrives is late: it
  becomes an error row (stage 'late'), handling SKIP (`late_handling: drop`: counted, not
  applied) or DEAD_LETTER.
- Upsert unzip (`state_ttl_seconds`): the previous image per key decides +I / -U / +U
  (`UpsertUnzip`). Its TTL is processing time since the key's last access and is checked on
  every access, so an expired image is never used; state TTL of the store itself is refused in
  event-time mode, so a cleanup timer removes expired images (it fires when the watermark
  passes the time left, and re-arms while the image is live). Time is the data's own, never the
  wall clock: the largest event time (`order_by`, else Kafka record time) of the group's rows in
  the micro-batch, or the watermark when a timer fires; a batch replayed after a crash therefore
  decides exactly as it did the first time. The TTL counts in that time.
- Compaction (ORDER BY only): the window released for a group is reduced to its net effect per
  upsert key (`compact`), so intermediate versions never reach the table.

Order of output rows: downstream stages order a key's rows by (timestamp, topic, partition,
offset, change_index). Rows derived from one input row keep its position; the rows of one
compacted key take the position of its last row; `change_index` is renumbered to
`_INDEX_STRIDE * change_index + n` (n counting the rows sharing a position) so that this order
is the order the stage emitted them in.

Error rows and TRUNCATE markers pass through untouched, each under a group of its own.

Time: event-time mode always. Processing-time mode would make Spark run a micro-batch on every
trigger forever (an `--until-idle` run would never end) and would not hand the watermark on to
a materializer behind this stage. The query's one watermark is declared here (see
`stateful_changelog`) on a column dropped before the operator, so Spark itself never filters
rows as late: this stage decides, and can dead-letter them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import LongType, StringType, StructField, StructType

from service.config.from_changelog import FromChangelogSettings, LateHandling, RecordHandling
from service.config.settings import PipelineSettings
from service.kafka_to_delta.changelog.event_time_order import EventTimeBuffer, compact
from service.kafka_to_delta.changelog.from_changelog import Marker
from service.kafka_to_delta.changelog.upsert_unzip import UpsertUnzip
from service.kafka_to_delta.rows.arrow import CHANGELOG_SCHEMA
from service.kafka_to_delta.rows.names import WATERMARK_COLUMN, Column, Stage
from service.kafka_to_delta.rows.spark import CHANGELOG_SPARK_SCHEMA
from service.runtime.worker_heap import task_started

GROUP = "_from_changelog_group"
PASSTHROUGH_PREFIX = "\u0000passthrough:"
_GROUP_SEPARATOR = "\u0000"
_WATERMARK_COLUMN = "_from_changelog_watermark"
_TEXT_STATE = StructType([StructField("state", StringType())])
_TIME_STATE = StructType([StructField("at_ms", LongType())])
_NAMES = tuple(CHANGELOG_SCHEMA.names)
_RAW = (Column.RAW_KEY, Column.RAW_VALUE, Column.HEADERS)
_SOURCE_ORDER = (Column.TOPIC, Column.PARTITION, Column.OFFSET, Column.CHANGE_INDEX)
_POSITION = (Column.TOPIC, Column.PARTITION, Column.OFFSET, Column.CHANGE_INDEX, Column.TIMESTAMP)
# Rows sharing one position: at most 2 per upsert key (-U, +U) and 2 upsert keys per input row.
_INDEX_STRIDE = 4
# Columns a late row keeps: where it came from and its original bytes (the rest is nulled, as on
# the error rows of the decode stage, so that no later stage takes it for a change).
_LATE_KEPT = (*_POSITION, *_RAW)
LATE_HANDLING: dict[LateHandling, RecordHandling] = {"drop": "SKIP", "dead_letter": "DEAD_LETTER"}
"""`late_handling` -> the `handling` of the late row's error row."""


@dataclass(frozen=True)
class OrderAndUnzipConfig:
    """What the processor needs from the FROM_CHANGELOG settings."""

    ordered: bool
    late_handling: LateHandling = "drop"
    state_ttl_seconds: float | None = None

    @classmethod
    def of(cls, settings: FromChangelogSettings) -> "OrderAndUnzipConfig":
        """The configuration of one pipeline's FROM_CHANGELOG settings."""
        return cls(settings.order_by is not None, settings.late_handling, settings.state_ttl_seconds)


def _source_order(row: dict) -> tuple:
    return tuple(row[name] for name in _SOURCE_ORDER)


def _watermark(timer_values: TimerValues) -> int | None:
    # Spark reports 0 (or -1) before the first watermark: no row can be late yet.
    watermark = timer_values.getCurrentWatermarkInMs()
    return watermark if watermark > 0 else None


def _late_row(row: dict, handling: RecordHandling, reason: str) -> dict:
    late = {name: row.get(name) for name in _LATE_KEPT}
    return {**late, Column.ERROR: reason, Column.HANDLING: handling, Column.STAGE: Stage.LATE.value}


def stamped(rows: list[dict], compacted: bool) -> list[dict]:
    """Rows with positions that sort in emission order (see the module docstring)."""
    if compacted:
        rows = _last_positions(rows)
    seen: dict[tuple, int] = {}
    out = []
    for row in rows:
        position = _source_order(row)
        number = seen.get(position, 0)
        seen[position] = number + 1
        out.append({**row, Column.CHANGE_INDEX: _INDEX_STRIDE * int(row[Column.CHANGE_INDEX]) + number})
    return out


def _last_positions(rows: list[dict]) -> list[dict]:
    """Each run of rows of one upsert key (as `compact` emits them) at the position of its last row."""
    out: list[dict] = []
    start = 0
    for index in range(1, len(rows) + 1):
        if index == len(rows) or rows[index][Column.UPSERT_KEY] != rows[start][Column.UPSERT_KEY]:
            position = {name: rows[index - 1][name] for name in _POSITION}
            out.extend({**row, **position} for row in rows[start:index])
            start = index
    return out


class OrderAndUnzipProcessor(StatefulProcessor):
    """ORDER BY buffer, previous image and cleanup time of one (topic, partition key) group."""

    def __init__(self, config: OrderAndUnzipConfig, clock: Callable[[], float] | None = None) -> None:
        self.config = config
        self.clock = clock or self._data_clock
        self._data_now_ms = 0

    def _data_clock(self) -> float:
        """Seconds of data time: what `_process` last saw (see the module docstring)."""
        return self._data_now_ms / 1000

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the state variables: `order` (buffered rows), `image` and `cleanup_at`."""
        task_started()
        self.handle = handle
        self.buffer = EventTimeBuffer("dead_letter")  # late rows come back; `late_handling` decides
        self.unzip = None
        if self.config.state_ttl_seconds is not None:
            self.unzip = UpsertUnzip(self.config.state_ttl_seconds, self.clock)
            self.image = handle.getValueState("image", _TEXT_STATE)
            self.cleanup_at = handle.getValueState("cleanup_at", _TIME_STATE)
        if self.config.ordered:
            self.order = handle.getValueState("order", _TEXT_STATE)

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: TimerValues) -> Iterator[Row]:
        """Pass error and TRUNCATE rows through; order, unzip and compact the group's changes."""
        if key[0].startswith(PASSTHROUGH_PREFIX):
            for row in rows:
                yield Row(**{name: row[name] for name in _NAMES})
            return
        records = sorted((row.asDict() for row in rows), key=_source_order)
        yield from self._process(records, timerValues)

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues, expiredTimerInfo: Any) -> Iterator[Row]:
        """Release what the watermark reached; remove an expired image."""
        yield from self._process([], timerValues)

    def _process(self, records: list[dict], timer_values: TimerValues) -> Iterator[Row]:
        watermark = _watermark(timer_values)
        times = [r[Column.EVENT_TIME] if r[Column.EVENT_TIME] is not None else r[Column.TIMESTAMP] for r in records]
        self._data_now_ms = max([watermark or 0, *(t for t in times if t is not None)])
        late: list[dict] = []
        changes = records
        if self.config.ordered:
            changes, late = self._ordered(records, watermark)
        if self.unzip is not None:
            changes = self._unzipped(changes, watermark)
        if self.config.ordered:
            changes = compact(changes)
        for row in late + stamped(changes, self.config.ordered):
            yield Row(**{name: row.get(name) for name in _NAMES})

    def _ordered(self, records: list[dict], watermark: int | None) -> tuple[list[dict], list[dict]]:
        """(rows the watermark released, in event-time order; error rows for the late ones)."""
        raw = {_source_order(r): {n: r[n] for n in _RAW} for r in records if any(r[n] is not None for n in _RAW)}
        bare = [{name: value for name, value in r.items() if name not in _RAW and name != GROUP} for r in records]
        stored = self.order.get()
        step = self.buffer.add(None if stored is None else stored[0], bare, watermark)
        if step.state is None:
            self.order.clear()
        else:
            self.order.update((step.state,))
            self.handle.registerTimer(EventTimeBuffer.next_release(step.state))
        handling = LATE_HANDLING[self.config.late_handling]
        late: dict[tuple, dict] = {}  # one error row per record, however many changes it held
        for row in step.late:
            row = {**row, **raw.get(_source_order(row), {})}
            late.setdefault(_source_order(row)[:3], _late_row(row, handling, row[Column.ERROR]))
        return step.released, list(late.values())

    def _unzipped(self, changes: list[dict], watermark: int | None) -> list[dict]:
        """The changes with their kinds decided by the previous image; expired images removed."""
        stored = self.image.get()
        state = None if stored is None else stored[0]
        if changes:
            step = self.unzip.apply(state, changes)
            changes, state = step.rows, step.state
            if state is not None:
                self.image.update((state,))
        elif state is None:
            return changes
        elif self.unzip.previous(state) is None:
            state = None  # expired: found by the cleanup timer
        if state is None:
            self.image.clear()
            self.cleanup_at.clear()
        else:
            self._arm_cleanup(state, watermark)
        return changes

    def _arm_cleanup(self, state: str, watermark: int | None) -> None:
        """One pending cleanup timer per group, at the watermark plus the time left."""
        expires = self.unzip.expires_at_ms(state)
        armed = self.cleanup_at.get()
        if expires is None or (armed is not None and (watermark is None or armed[0] > watermark)):
            return  # kept forever, or a timer is pending
        left = max(expires - int(self.clock() * 1000), 1)
        at = (watermark or 0) + left
        self.handle.registerTimer(at)
        self.cleanup_at.update((at,))

    def close(self) -> None:
        """Nothing to release."""


def _group_key() -> SparkColumn:
    position = F.concat_ws(":", Column.TOPIC, Column.PARTITION, Column.OFFSET, Column.CHANGE_INDEX)
    passthrough = F.col(Column.ERROR).isNotNull() | (F.col(Column.KIND) == Marker.TRUNCATE.value)
    return F.when(passthrough, F.concat(F.lit(PASSTHROUGH_PREFIX), position)).otherwise(
        F.concat_ws(_GROUP_SEPARATOR, Column.TOPIC, Column.PARTITION_KEY)
    )


def _with_watermark(changelog: DataFrame, pipeline: PipelineSettings, watermark_compaction: bool) -> DataFrame:
    """The query's one watermark (a second one after this operator would stall its releases)."""
    settings = pipeline.from_changelog
    if settings.order_by is not None:
        moment, delay_s = F.col(Column.EVENT_TIME), settings.watermark_delay_seconds
    elif watermark_compaction:
        moment, delay_s = F.coalesce(Column.EVENT_TIME, Column.TIMESTAMP), pipeline.effective_watermark_delay_seconds
    else:
        moment, delay_s = F.col(Column.TIMESTAMP), 0.0  # drives only the cleanup of expired images
    if WATERMARK_COLUMN in changelog.columns:
        moment = F.col(WATERMARK_COLUMN)  # the same event time, combined over partitions (minimum)
    delay = f"{int(delay_s * 1000)} milliseconds"
    return changelog.withColumn(_WATERMARK_COLUMN, F.timestamp_millis(moment)).withWatermark(_WATERMARK_COLUMN, delay)


def stateful_changelog(
    changelog: DataFrame, pipeline: PipelineSettings, watermark_compaction: bool = False,
) -> DataFrame:
    """The changelog after FROM_CHANGELOG's stateful steps (ORDER BY, upsert unzip).

    Output schema: `CHANGELOG_SCHEMA`, so the materializer or the per-batch reduction follows
    unchanged. The operator runs in event-time mode and declares the query's watermark: on
    `order_by` with its delay; else, when the materializer compacts on a watermark, on the
    column and delay it uses; else on the Kafka record time. A materializer behind it uses
    this watermark and must not declare its own. The caller runs it when the pipeline's shape
    has the stage (`shape.Shape.changelog_stage`); `watermark_compaction`: the shape's.
    """
    grouped = _with_watermark(changelog, pipeline, watermark_compaction).withColumn(GROUP, _group_key())
    processor = OrderAndUnzipProcessor(OrderAndUnzipConfig.of(pipeline.from_changelog))
    return grouped.select(*_NAMES, GROUP).groupBy(GROUP).transformWithState(
        processor, CHANGELOG_SPARK_SCHEMA, "Update", "EventTime"
    )

