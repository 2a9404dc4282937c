"""Per-partition event-time progress where records are decoded, and its way back to the source.

Each decoded row gets a watermark candidate (`WATERMARK_COLUMN`): min(largest event time read so
far in its own partition, the floor the source planned for the range: the least progress of the
other active partitions). The query's watermark is declared on that column, so Spark's watermark
(the largest candidate minus the delay) is the minimum over active partitions, never the largest
event time of the fastest one (see `connectors.kafka.watermarks`). A row's event time is its
FROM_CHANGELOG `order_by` time when there is one, else its Kafka record time; rows that failed
to decode carry no event time.

The largest event time per partition also goes to the driver, through a Spark accumulator
(`EventTimeMaxima`), and from there into the pipeline's progress file that the source reads when
it plans the next micro-batch.
"""

from __future__ import annotations

from typing import Mapping

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import SparkContext
from pyspark.accumulators import Accumulator, AccumulatorParam

from connectors.kafka.watermarks import ProgressFile, TopicPartition
from service.kafka_to_delta.rows.names import Column


class _MaxPerPartition(AccumulatorParam):
    """Accumulates `{(topic, partition): largest event time}`."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, value1: dict, value2: dict) -> dict:
        for tp, ms in value2.items():
            value1[tp] = max(ms, value1.get(tp, ms))
        return value1


def event_times(changes: pa.RecordBatch) -> pa.Array:
    """Each row's event time (epoch ms): `order_by` time, else Kafka time; null on error rows."""
    moment = pc.coalesce(changes.column(Column.EVENT_TIME), changes.column(Column.TIMESTAMP))
    return pc.if_else(pc.is_null(changes.column(Column.ERROR)), moment, pa.scalar(None, pa.int64()))


class PartitionWatermark:
    """Running largest event time of the partitions one decode task reads, and the candidates."""

    def __init__(self) -> None:
        self.maxima: dict[TopicPartition, int] = {}

    def candidates(self, floor: int | None, changes: pa.RecordBatch) -> pa.Array:
        """Watermark candidates of `changes` (rows of records of one Kafka partition, read with the watermark
        `floor`: `range_reader.FLOOR_COLUMN`)."""
        if changes.num_rows == 0:
            return pa.array([], pa.int64())
        tp = (changes.column(Column.TOPIC)[0].as_py(), changes.column(Column.PARTITION)[0].as_py())
        times = event_times(changes)
        previous = self.maxima.get(tp)
        if previous is not None:
            times = pc.coalesce(times, pa.scalar(previous, pa.int64()))
            times = pc.max_element_wise(times, pa.scalar(previous, pa.int64()))
        running = pc.cumulative_max(times, skip_nulls=True)
        top = pc.max(running).as_py()
        if top is not None:
            self.maxima[tp] = top
        return running if floor is None else pc.min_element_wise(running, pa.scalar(floor, pa.int64()))


class EventTimeMaxima:
    """Driver side: the accumulator the decode tasks report to, and the progress file it feeds."""

    def __init__(self, context: SparkContext, progress_path: str) -> None:
        self.accumulator: Accumulator = context.accumulator({}, _MaxPerPartition())
        self.file = ProgressFile(progress_path)

    def report(self, maxima: Mapping[TopicPartition, int]) -> None:
        """Executor side: add one task's maxima."""
        if maxima:
            self.accumulator.add(dict(maxima))

    def flush(self) -> dict[TopicPartition, int]:
        """Record what the finished batch read (call after its action); returns the maxima."""
        maxima = dict(self.accumulator.value)
        if maxima:
            self.file.merge(maxima)
        return maxima

    def __getstate__(self) -> dict:
        return {"accumulator": self.accumulator, "file": None}
