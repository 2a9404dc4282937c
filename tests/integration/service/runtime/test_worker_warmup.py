"""Python workers started ahead of a query's first micro-batch stay for its tasks."""

from __future__ import annotations

import os
import threading

import pytest
from pyspark.sql import SparkSession

from service.runtime.worker_warmup import READER_MODULES, warm, warm_workers


def test_warmed_workers_import_the_readers_and_stay(spark: SparkSession) -> None:
    pids = warm(spark, 2, READER_MODULES)
    assert len(pids) == 2 and os.getpid() not in pids
    assert all(os.path.exists(f"/proc/{pid}") for pid in pids), "workers are reused, not ended after the task"


def test_a_failed_warmup_only_loses_the_head_start(spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = ("service.no_such_module",)
    with pytest.raises(Exception, match="no_such_module"):
        warm(spark, 1, missing)  # the failure the background thread must absorb
    escaped: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: escaped.append(args.exc_value))
    thread = warm_workers(spark, missing)
    thread.join(timeout=300)
    assert not thread.is_alive() and escaped == []
    assert spark.range(3).count() == 3
