"""Kafka as a Spark streaming source (Python Data Source API), on confluent-kafka.

One Spark input partition per Kafka partition with new data (or per piece of one, with
`minPartitions`), read in parallel on the executors. The source offset is the next offset per
partition; Spark keeps it in the checkpoint's offset log, so consumer-group commits play no
part in correctness. The offset also carries each partition's event-time progress
(`connectors.kafka.watermarks`), so the per-partition watermark is checkpointed with it and
restored exactly on restart.

Options (keys are case-insensitive):
  bootstrap.servers        required
  topics                   comma-separated topic names
  startingoffsets          earliest (default) | latest | JSON {"topic": {"0": 42}}
  maxoffsetspertrigger     admission control: at most this many records per micro-batch
  progressfile             where the pipeline records the event times it read (enables the
                           per-partition watermark and event-time aligned admission)
  idletimeoutms            a partition with no unread data for this long stops holding the
                           watermark back (default: never)
  alignmentslackms         admission reads first from partitions less than this far ahead of
                           the one furthest behind in event time (default 0)
  ondataloss               fail (default) | earliest: when offsets still to be read were deleted
  minpartitions            cut the largest ranges in two until a micro-batch has this many input
                           partitions (default: one per Kafka partition); only for readers whose
                           result does not depend on where a partition's records were read. The
                           cut is recorded in the end offset (`$pieces`): a replay cuts alike
  minpartitionrows         no piece smaller than this (default 1000)
  kafka.<name>             any librdkafka option, passed through
"""

from __future__ import annotations

import json
import logging
import time
from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from connectors.kafka import offsets as om
from connectors.kafka import watermarks as wm
from connectors.kafka.cluster import ClusterView
from connectors.kafka.errors import DataLoss
from vocabulary.errors import ConfigError

FORMAT_NAME = "cdc_kafka"
_KAFKA_PREFIX = "kafka."
_DATA_LOSS = ("fail", "earliest")
_MIN_PARTITION_ROWS = 1_000
log = logging.getLogger(__name__)


class KafkaRange(InputPartition):
    """One Kafka partition's offset range for one micro-batch, with its watermark floor."""

    def __init__(self, topic: str, partition: int, start: int, end: int, floor: int | None = None) -> None:
        super().__init__((topic, partition, start, end, floor))
        self.topic, self.partition, self.start, self.end, self.floor = topic, partition, start, end, floor


def _client_options(options: dict[str, str]) -> dict[str, str]:
    lowered = {k.lower(): v for k, v in options.items()}
    client = {k[len(_KAFKA_PREFIX):]: v for k, v in lowered.items() if k.startswith(_KAFKA_PREFIX)}
    if "bootstrap.servers" not in lowered:
        raise ConfigError("the cdc_kafka source needs the option 'bootstrap.servers'")
    client["bootstrap.servers"] = lowered["bootstrap.servers"]
    return client


class KafkaSource(DataSource):
    """`spark.readStream.format("cdc_kafka")`: raw Kafka records with their coordinates."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        from connectors.kafka.range_reader import (
            RAW_SPARK_SCHEMA,  # Arrow is loaded where records are read
        )

        return RAW_SPARK_SCHEMA

    def streamReader(self, schema) -> "KafkaStreamReader":
        return KafkaStreamReader(dict(self.options))


def _now_ms() -> int:
    return int(time.time() * 1000)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans offset ranges on the driver; reads them on executors."""

    def __init__(self, options: dict[str, str]) -> None:
        lowered = {k.lower(): v for k, v in options.items()}
        self.client = _client_options(options)
        self.topics = [t.strip() for t in lowered.get("topics", "").split(",") if t.strip()]
        if not self.topics:
            raise ConfigError("the cdc_kafka source needs the option 'topics'")
        self.starting = lowered.get("startingoffsets", "earliest")
        limit = lowered.get("maxoffsetspertrigger")
        self.max_rows = int(limit) if limit else None
        self.progress_file = wm.ProgressFile(lowered["progressfile"]) if lowered.get("progressfile") else None
        idle = lowered.get("idletimeoutms")
        self.idle_timeout_ms = int(idle) if idle else None
        self.slack_ms = int(lowered.get("alignmentslackms", "0"))
        self.on_data_loss = lowered.get("ondataloss", "fail")
        self.min_partitions = int(lowered.get("minpartitions", "0"))
        self.min_partition_rows = int(lowered.get("minpartitionrows", str(_MIN_PARTITION_ROWS)))
        if self.on_data_loss not in _DATA_LOSS:
            raise ConfigError(f"the cdc_kafka source option 'onDataLoss' must be one of {_DATA_LOSS}")
        self.target: dict[tuple[str, int], int] | None = None
        self.admit = om.cap_rows  # admission without event-time alignment (a subclass may choose another)
        self._cluster: ClusterView | None = None
        self._marks: dict[tuple[str, int], tuple[int, int]] = {}

    def __getstate__(self) -> dict:
        # Executors get a copy of the reader for read(); the driver's client stays behind.
        return {**self.__dict__, "_cluster": None}

    @property
    def cluster(self) -> ClusterView:
        if self._cluster is None:
            self._cluster = ClusterView(self.client)
        return self._cluster

    def _watermarks(self) -> dict[tuple[str, int], tuple[int, int]]:
        self._marks = self.cluster.watermarks(self.cluster.partitions(self.topics))
        return self._marks

    def initialOffset(self) -> dict:
        marks = self._watermarks()
        if self.starting == "earliest":
            return om.to_map({tp: low for tp, (low, _) in marks.items()})
        if self.starting == "latest":
            return om.to_map({tp: high for tp, (_, high) in marks.items()})
        explicit = om.from_map(json.loads(self.starting))
        return om.to_map({tp: explicit.get(tp, low) for tp, (low, _) in marks.items()})

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {tp: high for tp, (_, high) in self._watermarks().items()}

    def _checked_start(self, begin: dict, marks: dict) -> dict:
        """Start offsets, with partitions new to the query from their beginning and deleted ranges
        failed (`ondataloss: fail`) or skipped with a warning (`earliest`)."""
        for tp, (low, _) in marks.items():
            begin.setdefault(tp, low)
            if begin[tp] >= low:
                continue
            where = f"topic={tp[0]} partition={tp[1]}: offsets {begin[tp]}..{low - 1}"
            if self.on_data_loss == "fail":
                raise DataLoss(
                    f"{where} were deleted before they were read (retention shorter than the pipeline's "
                    "lag); to resume from the earliest offset still there, set on_data_loss: earliest"
                )
            log.warning("%s were deleted before they were read: resuming at offset %d (on_data_loss: earliest)",
                        where, low)
            begin[tp] = low
        return begin

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        marks = self._watermarks()
        begin = self._checked_start(om.from_map(start), marks)
        available = {tp: high for tp, (_, high) in marks.items()}
        if self.target is not None:
            available = {tp: min(high, self.target.get(tp, begin[tp])) for tp, high in available.items()}
        available = {tp: max(end, begin[tp]) for tp, end in available.items()}
        max_rows = getattr(limit, "max_rows", None) if isinstance(limit, ReadMaxRows) else None
        if self.progress_file is None:
            end = self.admit(begin, available, max_rows)
            if all(end[tp] == om.from_map(start).get(tp) for tp in end):  # nothing new: keep the start's plan
                return {**om.to_map(end), **{k: v for k, v in start.items() if k == om.PIECES_KEY}}
            return {**om.to_map(end), **self._pieces()}
        progress = wm.Progress.from_json(start.get(wm.PROGRESS_KEY)).advanced(
            self.progress_file.read(), {tp: available[tp] > begin[tp] for tp in available}, _now_ms()
        )
        if max_rows is None:
            end = om.cap_rows(begin, available, None)
        else:
            end = wm.aligned_shares(begin, available, max_rows, progress, self.slack_ms)
        if all(end[tp] == om.from_map(start).get(tp) for tp in end):
            return start  # nothing new: the very same offset, or Spark would run an empty batch
        holding = progress.holding({tp: available[tp] > end[tp] for tp in available}, self.idle_timeout_ms)
        floors = progress.floors([tp for tp in end if end[tp] > begin[tp]], holding)
        return {**om.to_map(end), wm.PROGRESS_KEY: progress.floors_json(floors), **self._pieces()}

    def _pieces(self) -> dict:
        """The offset's record of how its ranges are cut: `partitions` cuts by it, not by the options
        of the process that replays the batch (whose core count may differ)."""
        return om.pieces_entry(self.min_partitions, self.min_partition_rows)

    def reportLatestOffset(self) -> dict | None:
        marks = self._marks or self._watermarks()
        return om.to_map({tp: high for tp, (_, high) in marks.items()})

    def partitions(self, start: dict, end: dict) -> list[KafkaRange]:
        begin = om.from_map(start)
        stops = om.from_map(end)
        ranges = [(tp, begin.get(tp, 0), stop) for tp, stop in sorted(stops.items()) if stop > begin.get(tp, 0)]
        ranges = om.split_spans(ranges, *om.planned_pieces(end))  # as planned: a replay cuts alike
        floors = wm.planned_floors(end.get(wm.PROGRESS_KEY))  # as planned: a replay uses the same
        return [KafkaRange(tp[0], tp[1], first, stop, floors.get(tp)) for tp, first, stop in ranges]

    def read(self, partition: KafkaRange) -> Iterator:
        from connectors.kafka.range_reader import read_range  # not in the processes that only plan

        return read_range(
            self.client, partition.topic, partition.partition, partition.start, partition.end, partition.floor
        )

    def commit(self, end: dict) -> None:
        """Nothing to do: progress lives in the Spark checkpoint, not in group offsets."""

    def stop(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None
