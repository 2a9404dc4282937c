"""The sink tests' Delta engines: each test that takes `engine` runs on both."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from connectors.delta.delta_rs import DeltaRsTable
from connectors.delta.delta_spark import DeltaSparkTable


@pytest.fixture(params=["delta-rs", "delta-spark"])
def engine(request: pytest.FixtureRequest):
    """(open a table, read a table back with that engine's reader: delta-rs, or Spark for delta-spark)."""
    if request.param == "delta-rs":
        return DeltaRsTable, lambda uri: DeltaTable(uri).to_pyarrow_table()
    spark = request.getfixturevalue("spark")
    return (lambda uri: DeltaSparkTable(spark, uri)), (lambda uri: spark.read.format("delta").load(uri).toArrow())
