"""Kafka as a Spark streaming source (Python Data Source API), on confluent-kafka.

One Spark input partition per Kafka partition with new data, read in parallel on the
executors. The source offset is the next offset per partition; Spark keeps it in the
checkpoint's offset log, so consumer-group commits play no part in correctness.

Options (keys are case-insensitive):
  bootstrap.servers        required
  topics                   comma-separated topic names
  startingoffsets          earliest (default) | latest | JSON {"topic": {"0": 42}}
  maxoffsetspertrigger     admission control: at most this many records per micro-batch
  kafka.<name>             any librdkafka option, passed through
"""

from __future__ import annotations

import json
from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from connectors.kafka import offsets as om
from connectors.kafka.cluster import ClusterView
from connectors.kafka.errors import DataLoss
from connectors.kafka.range_reader import RAW_SPARK_SCHEMA, read_range
from service.errors import ConfigError

FORMAT_NAME = "cdc_kafka"
_KAFKA_PREFIX = "kafka."


class KafkaRange(InputPartition):
    """One Kafka partition's offset range for one micro-batch."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


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
        return RAW_SPARK_SCHEMA

    def streamReader(self, schema) -> "KafkaStreamReader":
        return KafkaStreamReader(dict(self.options))


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
        self.target: dict[tuple[str, int], int] | None = None
        self._cluster: ClusterView | None = None

    def __getstate__(self) -> dict:
        # Executors get a copy of the reader for read(); the driver's client stays behind.
        return {**self.__dict__, "_cluster": None}

    @property
    def cluster(self) -> ClusterView:
        if self._cluster is None:
            self._cluster = ClusterView(self.client)
        return self._cluster

    def _watermarks(self) -> dict[tuple[str, int], tuple[int, int]]:
        return self.cluster.watermarks(self.cluster.partitions(self.topics))

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

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = om.from_map(start)
        marks = self._watermarks()
        for tp, (low, _) in marks.items():
            # Partitions that appeared after the query started are read from their beginning.
            begin.setdefault(tp, low)
            if begin[tp] < low:
                raise DataLoss(
                    f"topic={tp[0]} partition={tp[1]}: offsets {begin[tp]}..{low - 1} were deleted "
                    "before they were read (retention shorter than the pipeline's lag)"
                )
        available = {tp: high for tp, (_, high) in marks.items()}
        if self.target is not None:
            available = {tp: min(high, self.target.get(tp, begin[tp])) for tp, high in available.items()}
        available = {tp: max(end, begin[tp]) for tp, end in available.items()}
        max_rows = getattr(limit, "max_rows", None) if isinstance(limit, ReadMaxRows) else None
        return om.to_map(om.cap_rows(begin, available, max_rows))

    def reportLatestOffset(self) -> dict | None:
        return om.to_map({tp: high for tp, (_, high) in self._watermarks().items()})

    def partitions(self, start: dict, end: dict) -> list[KafkaRange]:
        begin = om.from_map(start)
        ranges = []
        for (topic, partition), stop in sorted(om.from_map(end).items()):
            first = begin.get((topic, partition), 0)
            if stop > first:
                ranges.append(KafkaRange(topic, partition, first, stop))
        return ranges

    def read(self, partition: KafkaRange) -> Iterator:
        return read_range(self.client, partition.topic, partition.partition, partition.start, partition.end)

    def commit(self, end: dict) -> None:
        """Nothing to do: progress lives in the Spark checkpoint, not in group offsets."""

    def stop(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None
