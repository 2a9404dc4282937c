"""The Kafka records of both inputs of a join as one stream (`connectors.kafka.source`), so the
offsets of both live in one checkpoint and a micro-batch is one barrier for both sides.
"""

from __future__ import annotations

import json

from pyspark.sql import DataFrame, SparkSession

from connectors.kafka.source import FORMAT_NAME, KafkaSource
from service.config.joins import JoinSettings
from service.config.settings import Settings
from vocabulary.errors import ConfigError


def starting_offsets(join: JoinSettings) -> str:
    """The source's startingOffsets for both inputs (one option for the one query)."""
    left, right = join.left.starting_offsets, join.right.starting_offsets
    if isinstance(left, dict) and isinstance(right, dict):
        return json.dumps({**left, **right})
    if left == right and isinstance(left, str):
        return left
    raise ConfigError(f"join {join.name}: both inputs must start from `earliest`, from `latest`, or from "
                      f"explicit offsets (got {left!r} and {right!r})")


def join_records(spark: SparkSession, settings: Settings, join: JoinSettings) -> DataFrame:
    """The Kafka records (`RAW_SCHEMA`) of every topic of both inputs, with the join's admission limit."""
    spark.dataSource.register(KafkaSource)
    reader = (spark.readStream.format(FORMAT_NAME)
              .option("bootstrap.servers", settings.kafka.bootstrap_servers)
              .option("topics", ",".join(join.topics))
              .option("startingOffsets", starting_offsets(join)))
    for key, value in settings.kafka.options.items():
        reader = reader.option(f"kafka.{key}", value)
    if join.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(join.max_offsets_per_trigger))
    return reader.load()
