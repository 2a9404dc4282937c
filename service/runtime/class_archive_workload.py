"""The workload whose classes go into the JVM class archive (`jvm_class_archive.prepare` runs this module).

`python -m service.runtime.class_archive_workload TARGET` starts a local session whose JVM writes the
classes it loaded to TARGET when it exits, runs what the service's queries load, and returns once the
JVM has exited (so the archive is whole).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit

from service.config.settings import SparkSettings
from service.runtime.jvm_class_archive import DUMP_TIMEOUT_S
from service.runtime.jvm_profiles import LIGHT
from service.runtime.spark_session import build_spark


def _dump(target: Path) -> None:
    """Run the workload in a local session whose JVM writes `target` at exit; return once it has exited."""
    from pyspark import SparkContext

    spark = build_spark(SparkSettings(master="local[2]"), jvm=LIGHT, class_archive_out=target)
    _exercise(spark)
    gateway = SparkContext._gateway
    spark.stop()
    assert gateway is not None, "build_spark started a gateway"
    process = gateway.proc  # the JVM: spark-class execs java
    gateway.shutdown()
    process.stdin.close()  # the JVM exits on end of input, writing the archive first
    process.wait(timeout=DUMP_TIMEOUT_S)


def _exercise(spark) -> None:  # type: ignore[no-untyped-def]
    """What the service's queries load: SQL with a shuffle, Arrow batches through Python, a streaming
    query over a Python data source with a RocksDB state store into foreachBatch."""
    from pyspark.sql import functions as F

    numbers = spark.range(0, 2000, 1, 2).withColumn("k", (F.col("id") % 7).cast("string"))
    numbers.mapInArrow(_same, numbers.schema).groupBy("k").count().toArrow()
    spark.dataSource.register(_TrainingSource)
    stream = spark.readStream.format(_TrainingSource.name()).load()
    counts = stream.groupBy("k").agg(F.count("*").alias("n"), F.max("id").alias("last"))
    with tempfile.TemporaryDirectory(prefix="cdc-lakehouse-archive-") as checkpoint:
        query = (counts.writeStream.outputMode("update").foreachBatch(lambda batch, _: batch.toArrow())
                 .option("checkpointLocation", checkpoint).start())
        try:
            query.processAllAvailable()
        finally:
            query.stop()


def _same(batches: Iterator) -> Iterator:
    yield from batches


class _TrainingStreamReader(DataSourceStreamReader):
    """Two offsets' worth of rows, read as Arrow batches."""

    def initialOffset(self) -> dict:
        return {"at": 0}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        return {"at": 2}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [InputPartition(at) for at in range(start["at"], end["at"])]

    def read(self, partition: InputPartition) -> Iterator:
        import pyarrow as pa

        at = partition.value  # type: ignore[attr-defined]
        ids = pa.array(range(at * 500, at * 500 + 500), pa.int64())
        yield pa.RecordBatch.from_arrays([ids, pa.compute.cast(pa.compute.bit_wise_and(ids, 7), pa.string())],
                                         names=["id", "k"])

    def commit(self, end: dict) -> None:
        """Nothing to release."""


class _TrainingSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "cdc_lakehouse_archive_training"

    def schema(self) -> str:
        return "id bigint, k string"

    def streamReader(self, schema) -> DataSourceStreamReader:  # type: ignore[no-untyped-def]
        return _TrainingStreamReader()


if __name__ == "__main__":
    _dump(Path(sys.argv[1]))
