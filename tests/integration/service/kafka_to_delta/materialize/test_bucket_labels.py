"""The bucket labels against Spark: `spark_hash_long` is Spark's `hash` of a long, `spark_partition` the
shuffle partition Spark's hash partitioning sends a label to (the spread layout's labels and bucket
numbers alike)."""

from __future__ import annotations

import random

from pyspark.sql import functions as F

from service.kafka_to_delta.materialize.bucket_labels import (
    spark_hash_long,
    spark_partition,
    spread_labels,
)
from service.kafka_to_delta.materialize.bulk import DEFAULT_KEY_BUCKETS, LEGACY_KEY_BUCKETS
from tests.support.run_seed import run_seed


def test_spark_hash_long_is_sparks_hash(spark):
    seed = run_seed(1 << 30)
    rnd = random.Random(seed)
    values = [0, 1, -1, 2**63 - 1, -(2**63), 42, *range(64)]
    values += [rnd.randrange(-(2**63), 2**63) for _ in range(500)] + [rnd.randrange(10**6) for _ in range(500)]
    frame = spark.createDataFrame([(v,) for v in values], "v long")
    spark_side = [row[0] for row in frame.select(F.hash("v")).collect()]
    assert spark_side == [spark_hash_long(v) for v in values], f"seed {seed}"


def test_labels_go_to_the_partitions_spark_sends_them_to(spark):
    labels = [*spread_labels(DEFAULT_KEY_BUCKETS), *spread_labels(LEGACY_KEY_BUCKETS), *range(64)]
    frame = spark.createDataFrame([(v,) for v in labels], "bucket long")
    for partitions in (2, 3, 4, 8):
        placed = frame.repartition(partitions, "bucket").select("bucket", F.spark_partition_id().alias("p")).collect()
        assert {(row.bucket, row.p) for row in placed} == {(v, spark_partition(v, partitions)) for v in labels}
