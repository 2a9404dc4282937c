"""Reduce one micro-batch of decoded changes to at most one net change per primary key.

The last change of a key in source order (topic, partition, offset) wins: its kind
says whether the key ends deleted or upserted, its row is the final image. Records
that failed to decode are kept, one row each, so the driver can report them.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

NET_COLUMNS = ("key", "kind", "row", "types", "error", "topic", "partition", "offset")
CHANGES_COLUMN = "changes"
_ERROR_KEY_PREFIX = "\u0000error:"


def _group_key() -> Column:
    # A record that failed to decode has no trustworthy key: give it one of its own.
    coordinates = F.concat_ws(":", F.col("topic"), F.col("partition"), F.col("offset"))
    return F.when(F.col("error").isNull(), F.col("key")).otherwise(
        F.concat(F.lit(_ERROR_KEY_PREFIX), coordinates)
    )


def net_changes(decoded: DataFrame) -> DataFrame:
    """One row per key: the last change in source order, plus one row per decode error.

    `changes` counts the decoded changes each row stands for.
    """
    carried = [c for c in NET_COLUMNS if c != "key"]
    order = F.struct("topic", "partition", "offset")
    last = F.max_by(F.struct(*carried, F.col("key").alias("source_key")), order).alias("last")
    grouped = decoded.groupBy(_group_key().alias("group_key")).agg(last, F.count("*").alias(CHANGES_COLUMN))
    return grouped.select(
        F.col("last.source_key").alias("key"), *[F.col(f"last.{c}") for c in carried], CHANGES_COLUMN
    )
