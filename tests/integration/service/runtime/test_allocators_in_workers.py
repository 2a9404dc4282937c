"""Spark's Python workers of a local session run with the service's allocator settings (they inherit
the driver's environment, set when the `service` package was imported)."""

from __future__ import annotations

import os
from typing import Iterator

import pyarrow as pa
from pyspark.sql import SparkSession

from service.runtime.allocators import ALLOCATOR_DEFAULTS


def _worker_allocators(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One row per input batch: the worker's allocator variables and Arrow's pool, space-separated."""
    names = [*sorted(ALLOCATOR_DEFAULTS), "pool"]
    values = [os.environ.get(name, "") for name in sorted(ALLOCATOR_DEFAULTS)] + [pa.default_memory_pool().backend_name]
    for _ in batches:
        yield pa.RecordBatch.from_arrays([pa.array([" ".join(names)]), pa.array([" ".join(values)])],
                                         names=["names", "values"])


def test_python_workers_get_the_allocator_settings(spark: SparkSession) -> None:
    expected = {name: os.environ[name] for name in ALLOCATOR_DEFAULTS}  # the driver's: defaults or an operator's
    rows = spark.range(0, 2, 1, 2).mapInArrow(_worker_allocators, "names string, values string").collect()
    assert rows, "no worker answered"
    for row in rows:
        found = dict(zip(row.names.split(" "), row["values"].split(" ")))
        assert {name: found[name] for name in ALLOCATOR_DEFAULTS} == expected
        assert found["pool"] == expected["ARROW_DEFAULT_MEMORY_POOL"]
