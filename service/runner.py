"""Runs every configured pipeline in one Spark session until told to stop or, with
`until_idle`, until everything available at start has been processed.

Stopping (SIGTERM / SIGINT): the running micro-batch is given time to finish; if it does
not, the query is stopped under it. Either way no half batch is committed: a batch's
Delta commit is atomic and carries its batch id, and Spark marks the batch done only
after that commit, so an abandoned batch is simply replayed on the next start.
"""

from __future__ import annotations

import logging
import signal
import threading
import time

from pyspark.sql.streaming import StreamingQuery

from service.errors import ConfigError, TerminalError
from service.kafka_to_delta.pipeline import IngestPipeline
from service.settings import Settings
from service.spark import build_spark

log = logging.getLogger(__name__)
_POLL_S = 0.5
_BATCH_GRACE_S = 60.0


_INIT_TIMEOUT_S = 120.0


class PipelineFailed(TerminalError):
    """A streaming query ended with an error that did not come from our own code."""

_INITIALIZING = "Initializing sources"


def _wait_initialized(query: StreamingQuery) -> None:
    # Each query starts a Python planner process for its source; starting them all at
    # once on a small machine makes them miss Spark's connect-back timeout. One by one.
    deadline = time.monotonic() + _INIT_TIMEOUT_S
    while query.isActive and time.monotonic() < deadline:
        if query.status.get("message") != _INITIALIZING and query.lastProgress is not None:
            return
        time.sleep(_POLL_S / 5)


class Runner:
    """Owns the Spark session and the streaming queries of one service process."""

    def __init__(self, settings: Settings) -> None:
        if not settings.pipelines:
            raise ConfigError("no pipelines configured: nothing to run")
        self.settings = settings
        self.stop_requested = threading.Event()
        self.pipelines: list[IngestPipeline] = []
        self.queries: list[StreamingQuery] = []

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT request a graceful stop."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop_requested.set())

    def start(self, until_idle: bool = False) -> None:
        """Start one streaming query per pipeline."""
        spark = build_spark(self.settings.spark)
        log.info("kafka: %s", self.settings.kafka.redacted())
        for config in self.settings.pipelines:
            pipeline = IngestPipeline(spark, self.settings, config)
            self.pipelines.append(pipeline)
            query = pipeline.start(until_idle)
            self.queries.append(query)
            _wait_initialized(query)

    def wait(self) -> None:
        """Block until all queries ended, one failed, or a stop was requested; then stop all.

        A failed pipeline's own error is re-raised as it was raised in the batch.
        """
        while not self.stop_requested.is_set():
            if not any(q.isActive for q in self.queries) or any(q.exception() for q in self.queries):
                break
            time.sleep(_POLL_S)
        self.stop()
        for pipeline, query in zip(self.pipelines, self.queries):
            if pipeline.failure is not None:
                raise pipeline.failure
            if query.exception() is not None:
                raise PipelineFailed(f"pipeline {pipeline.pipeline.name} failed: {query.exception().desc}")

    def stop(self) -> None:
        """Stop every query, letting an in-flight batch finish within a grace period."""
        deadline = time.monotonic() + _BATCH_GRACE_S
        for query in self.queries:
            while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
                time.sleep(_POLL_S / 5)
            query.stop()


def run(settings: Settings, until_idle: bool = False) -> Runner:
    """Run the service in the foreground; returns the runner once everything has stopped."""
    runner = Runner(settings)
    runner.install_signal_handlers()
    runner.start(until_idle)
    runner.wait()
    return runner
