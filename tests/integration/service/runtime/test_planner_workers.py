"""Spark's idle data-source planning processes are stopped, and start again when a query needs them."""

from __future__ import annotations

import time
from pathlib import Path

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from service.runtime.planner_workers import PLANNER_MODULES, stop_idle_planner_workers


class _Numbers(DataSource):
    @classmethod
    def name(cls) -> str:
        return "planner_workers_numbers"

    def schema(self) -> str:
        return "n int"

    def reader(self, schema) -> DataSourceReader:
        return _NumbersReader()


class _NumbersReader(DataSourceReader):
    def partitions(self):
        return [InputPartition(0)]

    def read(self, partition):
        yield from ((n,) for n in range(5))


def _planning_processes() -> list[int]:
    """Processes running one of Spark's data-source planning modules (of any Spark on this machine)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if any(word.decode(errors="replace") in PLANNER_MODULES for word in words):
            found.append(int(cmdline.parent.name))
    return found


def _read(spark) -> list[int]:
    return sorted(row.n for row in spark.read.format("planner_workers_numbers").load().collect())


def test_idle_planning_processes_are_stopped_and_come_back_when_needed(spark):
    spark.dataSource.register(_Numbers)
    for _ in range(3):  # a factory stopped before is stopped again once it has run again
        assert _read(spark) == list(range(5))  # a read starts what it needs (again)
        before = set(_planning_processes())
        assert before
        assert stop_idle_planner_workers(spark) >= 1
        deadline = time.monotonic() + 60
        while before & set(_planning_processes()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not before & set(_planning_processes())  # every one that was running is gone
