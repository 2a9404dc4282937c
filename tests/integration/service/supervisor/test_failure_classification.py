"""Failures produced by real streaming queries reach `classify` as the runner sees them.

A source planner and an executor report errors only as text inside Spark's exception; this
keeps the classification honest against the format of the PySpark in use (the unit tests
hold a larger set of texts captured the same way).
"""

from __future__ import annotations

from typing import Iterator

import pytest
from pyspark.sql import DataFrame
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from service.supervisor.failures import diagnose

QUERY_TIMEOUT_S = 120


def _failing_source() -> type:
    # Defined in a function so that Spark's Python processes receive the classes by value.
    class FailingReader(DataSourceStreamReader):
        def __init__(self, fail: str) -> None:
            self.fail = fail

        def initialOffset(self) -> dict:
            return {"o": 0}

        def latestOffset(self) -> dict:
            if self.fail == "planner-unavailable":
                from connectors.kafka.errors import KafkaUnavailable

                raise KafkaUnavailable("topic=orders: metadata not answered within 15s")
            return {"o": 1}

        def partitions(self, start: dict, end: dict) -> list:
            return [InputPartition(0)]

        def read(self, partition: InputPartition) -> Iterator[tuple]:
            if self.fail == "reader-key-error":
                {}["leader"]
            yield (1,)

    class FailingSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "failing_test_source"

        def schema(self) -> str:
            return "v int"

        def streamReader(self, schema):  # noqa: ANN001 - Spark's signature
            return FailingReader(self.options.get("fail", ""))

    return FailingSource


def _failure(spark, tmp_path, fail: str, batch) -> tuple[BaseException | None, str]:
    """(the error the batch function saw, the query's exception text) of one failed query."""
    spark.dataSource.register(_failing_source())
    seen: dict[str, BaseException] = {}

    def process(frame: DataFrame, batch_id: int) -> None:
        try:
            batch(frame, batch_id)
        except BaseException as error:
            seen["error"] = error
            raise

    query = (
        spark.readStream.format("failing_test_source").option("fail", fail).load()
        .writeStream.foreachBatch(process).option("checkpointLocation", str(tmp_path / fail)).start()
    )
    try:
        finished = query.awaitTermination(QUERY_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - the failure is read from the query below
        finished = True
    assert finished, f"query {fail} did not fail within {QUERY_TIMEOUT_S}s"
    exception = query.exception()
    assert exception is not None
    return seen.get("error"), str(exception)


def _collect(frame: DataFrame, batch_id: int) -> None:
    frame.toArrow()


def _driver_bug(frame: DataFrame, batch_id: int) -> None:
    frame.toArrow().column("v").schema  # noqa: B018 - a ChunkedArray has no .schema


@pytest.mark.parametrize(
    ("fail", "batch", "kind", "line"),
    [
        ("planner-unavailable", _collect, "transient", "KafkaUnavailable: topic=orders: metadata not answered"),
        ("reader-key-error", _collect, "programming", "KeyError: 'leader'"),
        ("none", _driver_bug, "programming", "AttributeError: "),
    ],
    ids=["planner-transient", "executor-programming", "driver-programming"],
)
def test_real_query_failures_are_classified(spark, tmp_path, fail, batch, kind, line):
    error, text = _failure(spark, tmp_path, fail, batch)
    diagnosis = diagnose(error, text)
    assert diagnosis.kind == kind and line in diagnosis.line
