"""Both inputs of a join as one stream of changelog rows, decoded on the executors.

One streaming query reads every topic of both inputs (`join_source.join_records`: the offsets of
both live in one checkpoint and a micro-batch is one barrier for both sides); each Kafka record batch
is decoded on the executors (`join_inputs.input_decoder`: the ingest's stateless FROM_CHANGELOG stage)
by the decoder of the input its topic belongs to, and every row is tagged with its `side`.
"""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from service.config.joins import RegularJoinSettings
from service.config.settings import Settings
from service.kafka_to_delta.joins.join_inputs import input_decoder
from service.kafka_to_delta.joins.join_source import join_records
from service.kafka_to_delta.rows.arrow import CHANGELOG_SCHEMA
from service.kafka_to_delta.rows.names import KafkaColumn
from service.runtime.worker_heap import task_started

SIDE = "side"
SIDES_SCHEMA = CHANGELOG_SCHEMA.append(pa.field(SIDE, pa.string()))


class SidesDecoder:
    """The `mapInArrow` function: Kafka records of both inputs -> changelog rows with their side. Picklable."""

    def __init__(self, join: RegularJoinSettings) -> None:
        self.left_topics = list(join.left.topics)
        self.decoders = {"left": input_decoder(join.left), "right": input_decoder(join.right)}

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task_started()
        for batch in batches:
            is_left = pc.is_in(batch.column(KafkaColumn.TOPIC), pa.array(self.left_topics, pa.string()))
            for side, mask in (("left", is_left), ("right", pc.invert(is_left))):
                part = batch.filter(mask)
                if part.num_rows:
                    decoded = self.decoders[side](part)
                    yield decoded.append_column(SIDE, pa.array([side] * decoded.num_rows, pa.string()))


def sides_stream(spark: SparkSession, settings: Settings, join: RegularJoinSettings) -> DataFrame:
    """The changelog rows of both inputs (`SIDES_SCHEMA`)."""
    return join_records(spark, settings, join).mapInArrow(SidesDecoder(join), from_arrow_schema(SIDES_SCHEMA))
