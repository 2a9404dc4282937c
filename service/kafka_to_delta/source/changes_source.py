"""A pipeline's Spark source: Kafka ranges read and decoded (and, on the plain path, reduced) where
they are read.

`spark.readStream.format(changes_source_name(pipeline))`: the same offsets, planning and
options as the `cdc_kafka` source (`connectors.kafka.source`), but each Kafka range comes out
as what the pipeline's reducer makes of it: on the plain path its payload of net changes
(`partition_changes`), a few rows per range instead of a row per record; on the stateful paths
its changelog rows (`decode_stage.DecodedRanges`), so raw records never go to the JVM and back
to a second Python stage. One registered source per pipeline: the pipeline's decoder travels inside
the source (pickled to the executors), never through options, so no credential of a schema
registry appears in a query plan. It travels as bytes, unpickled only where a range is read:
the processes that create the source and plan its reads do not import the decoders (about
20 MiB less in each of three of them).
"""

from __future__ import annotations

import pickle
import re
from typing import TYPE_CHECKING, Iterator, cast

from pyspark import cloudpickle
from pyspark.sql.datasource import DataSource, InputPartition

from connectors.kafka.source import KafkaRange, KafkaSource, KafkaStreamReader
from service.kafka_to_delta.rows.names import PAYLOAD_SPARK_SCHEMA
from service.runtime.memory_release import release_memory
from service.runtime.worker_heap import task_started

if TYPE_CHECKING:
    from service.kafka_to_delta.source.decode_stage import DecodedRanges
    from service.kafka_to_delta.source.partition_changes import PartitionReducer

_NAME_PREFIX = "cdc_changes_"


class ChangesStreamReader(KafkaStreamReader):
    """Plans like the Kafka source; each range is read, decoded and reduced by `reducer`."""

    def __init__(self, options: dict[str, str], reducer: bytes) -> None:
        super().__init__(options)
        self.reducer = reducer  # a pickled `PartitionReducer`

    def read(self, partition: InputPartition) -> Iterator:
        from connectors.kafka.range_reader import read_values  # not in the processes that only plan

        task_started()
        reducer: PartitionReducer | DecodedRanges = pickle.loads(self.reducer)
        kafka_range = cast(KafkaRange, partition)

        def values(keep_records: bool = False) -> Iterator:
            return read_values(self.client, kafka_range.topic, kafka_range.partition, kafka_range.start,
                               kafka_range.end, keep_records, kafka_range.floor)

        yield from reducer(lambda: super(ChangesStreamReader, self).read(kafka_range), values)
        release_memory()


def changes_source_name(pipeline_name: str) -> str:
    """The format name of one pipeline's source."""
    return _NAME_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", pipeline_name)


def changes_source(pipeline_name: str, reducer: "PartitionReducer | DecodedRanges",
                   schema: str = PAYLOAD_SPARK_SCHEMA) -> type[DataSource]:
    """A data source class for one pipeline (register it with `spark.dataSource.register`): each
    Kafka range through `reducer`, whose rows have `schema` (the plain path's payloads, or the
    stateful paths' changelog rows, `decode_stage.DecodedRanges`)."""
    format_name = changes_source_name(pipeline_name)
    pickled = cloudpickle.dumps(reducer)

    class ChangesSource(KafkaSource):
        """What `reducer` makes of each Kafka range."""

        @classmethod
        def name(cls) -> str:
            return format_name

        def schema(self) -> str:
            return schema

        def streamReader(self, schema) -> ChangesStreamReader:
            return ChangesStreamReader(dict(self.options), pickled)

    return ChangesSource
