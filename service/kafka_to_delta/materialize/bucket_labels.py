"""The values the bucket stage groups by: one label per key bucket, spread over Spark's shuffle partitions.

Spark sends each group of a stateful operator to the shuffle partition `pmod(murmur3(value), P)`
(`HashPartitioning`, seed 42). With the bucket numbers themselves as the values, 16 buckets land 7 and 9
on two partitions and 6/6/1/3 on four, so one task does 9/16 (or 6/16) of every batch's work and the
stage waits for it. A spread layout labels bucket `b` with the smallest number whose hash has `b` in its
low bits (`count` a power of two): then every power of two P <= `count` gets `count / P` buckets in each
partition, whatever P the checkpoint began with. Which value a bucket's state is stored under is part
of the checkpoint's layout (`plan.compiled_plan.state_layout`): a checkpoint keeps the labels it began
with (the bucket numbers for one begun before the spread layout).

`tests/integration/service/kafka_to_delta/materialize/test_bucket_labels.py` checks `spark_partition` and
the spread against Spark's own partitioning.
"""

from __future__ import annotations

from functools import lru_cache

_SEED = 42  # Spark's Murmur3Hash seed for HashPartitioning
_MASK = 0xFFFFFFFF
_C1, _C2 = 0xCC9E2D51, 0x1B873593


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def _mix(h1: int, word: int) -> int:
    k1 = _rotl((word * _C1) & _MASK, 15) * _C2 & _MASK
    h1 = _rotl(h1 ^ k1, 13)
    return (h1 * 5 + 0xE6546B64) & _MASK


def spark_hash_long(value: int) -> int:
    """Spark's `hash(value)` of a long (`Murmur3_x86_32.hashLong` with seed 42), as a signed int."""
    value &= (1 << 64) - 1
    h1 = _mix(_mix(_SEED, value & _MASK), value >> 32)
    h1 ^= 8
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _MASK
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


def spark_partition(value: int, partitions: int) -> int:
    """The shuffle partition Spark's hash partitioning sends a long grouping value to."""
    return spark_hash_long(value) % partitions  # Python's modulo of a positive divisor is Spark's pmod


def spreads(count: int) -> bool:
    """Whether `count` buckets can be spread (a power of two)."""
    return count > 0 and count & (count - 1) == 0


@lru_cache(maxsize=8)
def spread_labels(count: int) -> tuple[int, ...]:
    """Label of each of `count` buckets (a power of two): the smallest number whose hash has the bucket
    in its low bits."""
    if not spreads(count):
        raise ValueError(f"{count} key buckets cannot be spread: not a power of two")
    labels: list[int | None] = [None] * count
    found, value = 0, 0
    while found < count:
        bucket = spark_hash_long(value) & (count - 1)
        if labels[bucket] is None:
            labels[bucket] = value
            found += 1
        value += 1
    return tuple(label for label in labels if label is not None)


def bucket_labels(count: int, spread: bool) -> tuple[int, ...] | None:
    """The labels of a layout's buckets; None where the bucket numbers are the labels."""
    return spread_labels(count) if spread and count else None
