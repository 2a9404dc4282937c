"""Stop the Python processes Spark keeps for planning Python data sources once they sit idle.

Spark starts a daemon and a worker for each of three planning steps of a Python data source: looking
data sources up, creating one and planning its reads (`pyspark.sql.worker.lookup_data_sources`,
`create_data_source`, `plan_data_source_read`). They run when a query starts and are idle for the rest
of the service's life, holding memory (figures: docs/design/runtime-tuning.md). The micro-batches
themselves plan in the streaming source runner and read in the task workers, which are not touched
here. The runner stops them when a query enters its first micro-batch
(`BatchPipeline.on_first_batch`), unless another query is being started.

Spark has no setting for this: its worker factories (`SparkEnv.pythonWorkers`) are internal, so they
are reached by reflection, and only a factory whose workers are all idle is stopped. A factory that is
needed again (a query restarted) starts its daemon anew. Any failure to reach them (another Spark
version) is logged once and leaves the processes running.
"""

from __future__ import annotations

import logging
import threading

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

PLANNER_MODULES = frozenset((
    "pyspark.sql.worker.lookup_data_sources",
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.plan_data_source_read",
))
_LOCK = threading.Lock()


def stop_idle_planner_workers(spark: SparkSession) -> int:
    """Stop the planning factories whose workers are all idle; how many were stopped."""
    with _LOCK:
        try:
            return _stop_idle(spark)
        except Exception as error:  # noqa: BLE001 - internals of another Spark version: leave them
            log.info("Spark's idle data-source planning processes left running (%s)", str(error).splitlines()[0][:200])
            return 0


def _private(jvm_object, name: str):
    field = jvm_object.getClass().getDeclaredField(name)
    field.setAccessible(True)
    return field.get(jvm_object)


def _live_workers(factory) -> int:
    """The factory's workers whose process is alive (it keeps stopped ones listed until they are collected)."""
    handles = _private(factory, "daemonWorkers").values().iterator()
    live = 0
    while handles.hasNext():
        live += bool(handles.next().isAlive())
    return live


def _stop_idle(spark: SparkSession) -> int:
    jvm = spark._jvm
    if jvm is None:
        return 0  # a Spark Connect session: no JVM here
    env = jvm.org.apache.spark.SparkEnv.get()
    factories = _private(env, "pythonWorkers")
    stopped = 0
    entries = factories.iterator()
    while entries.hasNext():
        entry = entries.next()
        key, factory = entry._1(), entry._2()
        if key.workerModule() not in PLANNER_MODULES or _private(factory, "daemon") is None:
            continue  # not a planning step's, or stopped already
        if _live_workers(factory) > factory.idleWorkers().size():
            continue  # a planning step is running right now
        factory.stop()
        stopped += 1
    if stopped:
        log.info("stopped %d idle data-source planning daemon(s) of Spark", stopped)
    return stopped
