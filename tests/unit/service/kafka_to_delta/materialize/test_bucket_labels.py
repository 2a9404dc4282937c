"""A spread layout's bucket labels (`bucket_labels`): every power-of-two partition count gets the same
number of buckets in each partition (`spark_partition` is checked against Spark in
tests/integration/service/kafka_to_delta/materialize/test_bucket_labels.py)."""

from __future__ import annotations

import collections

import pytest

from service.kafka_to_delta.materialize.bucket_labels import bucket_labels, spark_partition, spread_labels
from service.kafka_to_delta.materialize.bulk import DEFAULT_KEY_BUCKETS, LEGACY_KEY_BUCKETS


def test_a_spread_layout_fills_every_power_of_two_partition_count_evenly():
    for count in (DEFAULT_KEY_BUCKETS, LEGACY_KEY_BUCKETS, 2):
        labels = spread_labels(count)
        assert len(set(labels)) == count
        for partitions in (p for p in (1, 2, 4, 8, 16, 32, 64) if p <= count):
            per_partition = collections.Counter(spark_partition(label, partitions) for label in labels)
            assert sorted(per_partition.values()) == [count // partitions] * partitions, (count, partitions)
    # The bucket numbers themselves: what the spread layout is for.
    numbers = collections.Counter(spark_partition(b, 2) for b in range(DEFAULT_KEY_BUCKETS))
    assert sorted(numbers.values()) == [7, 9]


def test_only_a_power_of_two_spreads_and_the_numbers_label_the_other_layout():
    assert bucket_labels(DEFAULT_KEY_BUCKETS, spread=False) is None
    assert bucket_labels(0, spread=True) is None
    assert bucket_labels(DEFAULT_KEY_BUCKETS, spread=True) == spread_labels(DEFAULT_KEY_BUCKETS)
    with pytest.raises(ValueError, match="power of two"):
        spread_labels(12)
