"""Runs every configured pipeline in one Spark session until told to stop or, with
`until_idle`, until everything available at start has been processed.

With `until_idle`, exports start once every ingest pipeline has finished, so they publish
what this run ingested (an export's run ends at the table version it finds when it starts).

Stopping (SIGTERM / SIGINT): the running micro-batch is given time to finish; if it does
not, the query is stopped under it. Either way no half batch is committed: a batch's
Delta commit is atomic and carries its batch id, and Spark marks the batch done only
after that commit, so an abandoned batch is simply replayed on the next start.

Failures: a terminal one (bad input, bad config, data loss) stops the service with that
error. A transient one restarts the failed pipeline from its checkpoint after a backoff,
at most `recovery.max_attempts` times in a row without a committed batch in between.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass
from http.server import ThreadingHTTPServer

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from service.config.settings import Settings
from service.delta_to_kafka.exports import export_pipeline
from service.delta_to_kafka.pipeline import ExportPipeline
from service.kafka_to_delta.database.query import DatabaseQuery
from service.kafka_to_delta.database.tables import (
    cluster_topics,
    needs_topics,
    with_table_pipelines,
)
from service.kafka_to_delta.joins import join_pipeline
from service.kafka_to_delta.pipeline import IngestPipeline
from service.kafka_to_delta.plan.compiled_plan import compile_plan, join_operators
from service.kafka_to_delta.plan.table_queries import check_table_queries
from service.kafka_to_delta.plan.upgrades import check_and_store, check_and_store_pipeline
from service.observability import health, metrics
from service.runtime.jvm_profiles import JvmProfile, jvm_profile
from service.runtime.planner_workers import stop_idle_planner_workers
from service.runtime.spark_session import build_spark
from service.runtime.worker_warmup import warm_workers, warmup_modules
from service.supervisor.failures import classify
from vocabulary import redaction
from vocabulary.errors import ConfigError, TerminalError

log = logging.getLogger(__name__)
_POLL_S = 0.5
_BATCH_GRACE_S = 60.0
_INIT_TIMEOUT_S = 120.0
_INITIALIZING = ("Initializing StreamExecution", "Initializing sources")  # Spark's first two status messages


def _wait_initialized(query: StreamingQuery, stop: threading.Event) -> None:
    """Until `query` has created its sources (or ended, or the timeout passed).

    Each query starts a Python process for its source while its sources are initialised; starting
    them all at once on a small machine makes them miss Spark's connect-back timeout, so queries
    start one by one. The next start need not wait for this query's first micro-batch: that batch
    runs beside it (docs/design/runtime-tuning.md, "Query start")."""
    deadline = time.monotonic() + _INIT_TIMEOUT_S
    while query.isActive and time.monotonic() < deadline and not stop.is_set():
        if query.status.get("message") not in _INITIALIZING:
            return
        time.sleep(_POLL_S / 5)


def _close(entry: "_Supervised") -> None:
    close = getattr(entry.pipeline, "close", None)
    if close is not None:
        close()


@dataclass
class _Supervised:
    """One pipeline, its current query and its run of failures."""

    pipeline: IngestPipeline | DatabaseQuery | ExportPipeline
    query: StreamingQuery | None = None
    failures: int = 0
    batches_at_failure: int = 0
    restart_at: float | None = None
    finished: bool = False


class Runner:
    """Owns the Spark session and the streaming queries of one service process."""

    def __init__(self, settings: Settings) -> None:
        if not settings.pipelines and not settings.databases and not settings.joins and not settings.exports:
            raise ConfigError("no pipelines or exports configured: nothing to run")
        self.settings = settings
        redaction.configure(settings.log_values)
        self.stop_requested = threading.Event()
        self.supervised: list[_Supervised] = []
        self.until_idle = False
        self._spark: SparkSession | None = None
        self._exports_started = False
        self._starting: _Supervised | None = None  # the entry `_start` is starting
        self._starting_all = False  # `start` is starting every query
        self._idle_progress_s = health.DEFAULT_IDLE_PROGRESS_S
        self.endpoint: ThreadingHTTPServer | None = None  # /metrics, /healthz, /readyz (with metrics_port)

    @property
    def pipelines(self) -> list[IngestPipeline | DatabaseQuery | ExportPipeline]:
        """The ingest pipelines and exports this runner drives."""
        return [s.pipeline for s in self.supervised]

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT request a graceful stop."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop_requested.set())

    def start(self, until_idle: bool = False) -> None:
        """Start one streaming query per pipeline."""
        self.until_idle = until_idle
        if self.settings.metrics_port:
            self.endpoint = metrics.serve(self.settings.metrics_port, self.settings.metrics_address, self.readiness)
            log.info("metrics on http://%s:%d/metrics (and /healthz, /readyz)", self.settings.metrics_address,
                     self.settings.metrics_port)
        if needs_topics(self.settings):  # database tables with state run as pipelines of their own
            self.settings = with_table_pipelines(self.settings, cluster_topics(self.settings.kafka.client_config()))
        check_table_queries(self.settings)  # a started database table moved into or out of a query of its own
        for config in self.settings.pipelines:  # before anything runs: an incompatible upgrade is refused
            check_and_store_pipeline(config, self.settings.checkpoint_dir(config.name))
        for join in self.settings.joins:
            check_and_store(join.name, self.settings.checkpoint_dir(join.name), join_operators(join))
        self._spark = build_spark(self.settings.spark, jvm=self._jvm(), engine=self.settings.lakehouse.engine,
                                  checkpoint_root=self.settings.checkpoint_root)
        modules = self._warmup_modules()
        if modules:
            warm_workers(self._spark, modules)
        self._idle_progress_s = health.idle_progress_seconds(self._spark)
        log.info("kafka: %s", self.settings.kafka.redacted())
        self._starting_all = True
        for config in self.settings.pipelines:
            entry = _Supervised(IngestPipeline(self._spark, self.settings, config))
            self.supervised.append(entry)
            self._start(entry)
        for database in self.settings.databases:
            entry = _Supervised(DatabaseQuery(self._spark, self.settings, database))
            self.supervised.append(entry)
            self._start(entry)
        for join in self.settings.joins:
            entry = _Supervised(join_pipeline(self._spark, self.settings, join))
            self.supervised.append(entry)
            self._start(entry)
        if not (until_idle and (self.settings.pipelines or self.settings.databases or self.settings.joins)):
            self._start_exports()
        self._starting_all = False
        self._sources_planned(None)

    def _jvm(self) -> JvmProfile:
        """The local JVM's flags, chosen from the stateful operators of the compiled plan (`jvm_profiles`)."""
        return jvm_profile(compile_plan(self.settings))

    def _warmup_modules(self) -> tuple[str, ...]:
        """What the Python workers import ahead of the first batch, chosen from the compiled plan and the
        input formats (`worker_warmup`)."""
        formats = [p.format for p in self.settings.pipelines] + [d.format for d in self.settings.databases]
        formats += [side.format for join in self.settings.joins for side in (join.left, join.right)]
        return warmup_modules(compile_plan(self.settings), formats, databases=bool(self.settings.databases))

    def _start_exports(self) -> None:
        assert self._spark is not None, "start() creates the session first"
        self._exports_started = True
        for export in self.settings.exports:
            entry = _Supervised(export_pipeline(self._spark, self.settings, export))
            self.supervised.append(entry)
            self._start(entry)

    def _start(self, entry: _Supervised) -> None:
        entry.pipeline.failure = None
        entry.pipeline.entered_batch = False
        entry.pipeline.on_first_batch = lambda: self._sources_planned(entry)
        self._starting = entry
        try:
            entry.query = entry.pipeline.start(self.until_idle)
            entry.restart_at = None
            _wait_initialized(entry.query, self.stop_requested)
        finally:
            self._starting = None

    def _sources_planned(self, entry: _Supervised | None) -> None:
        """`entry`'s query entered its first micro-batch (None: `start` is done): unless queries are
        still being started (one by one; each start needs them), Spark's data-source planning
        processes sit idle until a query starts again, and are stopped (`planner_workers`)."""
        if self._spark is None:
            return
        if entry is not None and (self._starting_all or self._starting not in (None, entry)):
            return
        stop_idle_planner_workers(self._spark)

    def wait(self) -> None:
        """Supervise until every query finished or a stop was requested; then stop all.

        Raises the terminal error of a pipeline (its own error object when our code raised it).
        """
        try:
            while not self.stop_requested.is_set():
                for entry in self.supervised:
                    self._supervise(entry)
                if all(e.finished for e in self.supervised):
                    if self._exports_started or not self.settings.exports:
                        break
                    log.info("every ingest pipeline is idle: starting the exports")
                    self._start_exports()
                time.sleep(_POLL_S)
        finally:
            self.stop()

    def _supervise(self, entry: _Supervised) -> None:
        if entry.finished:
            return
        if entry.restart_at is not None:
            if time.monotonic() >= entry.restart_at:
                try:
                    self._start(entry)
                except Exception as error:  # noqa: BLE001 - the restart itself failed (e.g. committing a batch
                    # written ahead): a failure of the run like any other, retried while it is transient
                    self._on_failure(entry, classify(entry.pipeline.name, error, str(error)))
            return
        query = entry.query
        if query is None:  # not started yet
            return
        if query.isActive:
            # A commit that failed behind the query is raised by its next batch (whose commit waits for it), not
            # stopped from here: a stop while the query plans its next batch can leave a planning process broken.
            metrics.record_lag(entry.pipeline.name, query.lastProgress, isinstance(entry.pipeline, ExportPipeline))
            return
        entry.pipeline.settle_commits()  # a commit behind the query ends first
        exception = query.exception()
        behind = entry.pipeline.failed_behind
        if exception is None and behind is None:
            entry.finished = True
            _close(entry)
            return
        if exception is None:
            self._on_failure(entry, classify(entry.pipeline.name, behind, str(behind)))
            return
        self._on_failure(entry, classify(entry.pipeline.name, entry.pipeline.failure, str(exception)))

    def _on_failure(self, entry: _Supervised, error: Exception) -> None:
        batches = entry.pipeline.committed_batches
        entry.failures = 1 if batches > entry.batches_at_failure else entry.failures + 1
        entry.batches_at_failure = batches
        recovery = self.settings.recovery
        if isinstance(error, TerminalError) or entry.failures > recovery.max_attempts:
            raise error
        delay = recovery.backoff(entry.failures)
        metrics.RESTARTS.labels(entry.pipeline.name).inc()
        log.warning("%s; restart %d of %d in %.1fs", error, entry.failures, recovery.max_attempts, delay,
                    extra={"pipeline": entry.pipeline.name})
        entry.restart_at = time.monotonic() + delay

    def readiness(self) -> health.Readiness:
        """Readiness of every configured pipeline and export, as /readyz serves it (service/observability/health.py)."""
        max_age = health.max_progress_age(self.settings.readiness_stale_triggers,
                                          self.settings.trigger_interval_seconds, self._idle_progress_s)
        started = {entry.pipeline.name: entry for entry in list(self.supervised)}
        names = [p.name for p in self.settings.pipelines] + [d.name for d in self.settings.databases]
        names += [j.name for j in self.settings.joins]
        names += [e.name for e in self.settings.exports]
        queries = tuple(
            health.query_health(name, None, restarting=False, finished=False, max_age_s=max_age)
            if name not in started else
            health.query_health(name, started[name].query, restarting=started[name].restart_at is not None,
                                finished=started[name].finished, max_age_s=max_age,
                                failed_commit=started[name].pipeline.failed_behind)
            for name in names
        )
        set_aside = tuple(  # a database's quarantined tables: each named, with why
            health.PipelineHealth(f"{entry.pipeline.name}.{table}", False,
                                  f"quarantined at batch {why.get('batch_id')}: {why.get('reason')}")
            for entry in list(self.supervised) if isinstance(entry.pipeline, DatabaseQuery)
            for table, why in sorted(entry.pipeline.quarantined().items())
        )
        return health.Readiness(queries + set_aside)

    def stop(self) -> None:
        """Stop every query, letting an in-flight batch finish within a grace period."""
        deadline = time.monotonic() + _BATCH_GRACE_S
        for entry in self.supervised:
            query = entry.query
            if query is None:
                continue
            while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
                time.sleep(_POLL_S / 5)
            query.stop()
            _close(entry)


def run(settings: Settings, until_idle: bool = False) -> Runner:
    """Run the service in the foreground; returns the runner once everything has stopped."""
    runner = Runner(settings)
    runner.install_signal_handlers()
    runner.start(until_idle)
    runner.wait()
    return runner
