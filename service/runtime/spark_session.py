"""The only SparkSession builder.

With `engine="delta-spark"` the session carries the Delta jars and its SQL extension and catalog
(`connectors.delta.delta_spark.session_conf`): the jars of the cache (connectors/maven_jars.py)
when they are resolved, else the Maven package, which Spark resolves from Maven Central at start.
`spark.jars` also ships them to a cluster's executors. A session that cannot run delta-spark
stops the start with `DeltaSparkUnavailable` naming the fix.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from connectors.delta.delta_spark import (
    DeltaSparkUnavailable,
    missing_delta_reason,
    session_conf,
    unresolved_failure,
)
from connectors.delta.engines import Engine
from service.config.settings import SparkSettings
from service.runtime.jvm_class_archive import dump_options, session_options

_ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_QUIET_LOG_LEVEL = "ERROR"
# Spark masks option and conf values whose keys match this in logs, plans and the UI; it covers
# every key `settings.is_secret_key` hides (tests/integration/service/config/test_secrets.py).
_REDACTION = r"(?i)secret|password|token|access[.]?key|jaas|credential|key[.]pem|oauthbearer[.]config"
_LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
# The JVM of a local session collects with the serial collector: the 2 cores are the Python workers'.
# With `quick_jit` (the plain path: the JVM only plans, tracks offsets and moves Arrow batches) it
# starts with a small heap and gives back what a collection freed (its RSS on 300,000 events 425 ->
# 383 MiB), and compiles with C1 only (the JVM's CPU for that run 12.8 s -> 7.9 s, wall 18.0 -> 16.8 s).
# Stateful stages (materializer, joins: rows through shuffles and the state store) keep C2, as C1
# code made a steady batch of 10,000 ~10 % slower there (1.65 -> 1.87 s), and get a fixed young
# generation: they allocate far more per record, and the small heap's young generation (~21 MiB)
# was collected every few hundred milliseconds (the collector's thread ~0.14 s of CPU per batch).
# A steady materializer batch of 10,000, in-process: 1.43 s before, 1.34-1.35 s with a young
# generation of 64, 128 or 256 MiB alike (one run each; 1.44 -> 1.33 s in two earlier A/B pairs with
# 256 MiB), so the smallest; the JVM's RSS at the tree's peak ranged 650-980 MiB over these runs
# without a pattern the runs could separate from noise.
# With `packed_state` (every stateful stage is the bucket materializer reading changes packed per
# bucket: the JVM shuffles and stores one value per bucket, not a row per change) the stateful heap
# compiles with C1 only as well: a steady materializer batch of 10,000, in-process, two A/B pairs,
# 754 / 759 ms with C2 -> 696 / 715 ms (C2 kept compiling through the whole run: 1.8 s of CPU per
# 12 s of steady batches).
_C1_ONLY = "-XX:TieredStopAtLevel=1"
_LIGHT_JVM_OPTIONS = f"-XX:+UseSerialGC -Xms64m -XX:MinHeapFreeRatio=5 -XX:MaxHeapFreeRatio=20 {_C1_ONLY}"
_STATEFUL_JVM_OPTIONS = "-XX:+UseSerialGC -Xmn64m -XX:MinHeapFreeRatio=5 -XX:MaxHeapFreeRatio=20"


# A state store commit writes what changed to a changelog file instead of flushing RocksDB and copying
# its new files into the checkpoint; a background task snapshots every few versions. Spark switches an
# existing checkpoint either way. A steady materializer batch of 10,000 (in-process, two runs each, with
# the bucket documents zstd-compressed): 0.98 / 0.98 s without, 0.91 / 0.97 s with; Spark's commit time
# over the two state stores 212-259 -> 100-150 ms with plain documents.
_CHANGELOG_CHECKPOINTING = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
# Comma-separated settings an engine's conf and the operator's `spark.conf` both add to.
_LISTS = ("spark.jars", "spark.jars.packages", "spark.sql.extensions")
# Delta rebuilds a table's state from its log in this many partitions (Delta's default 50; with adaptive
# execution off nothing merges them). The session's shuffle partitions instead: a MERGE of 2 rows on a
# loaded 2-core machine took 12-17 s with 50 and 3-4 s with 2.
_SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"


def _with_engine_conf(conf: dict[str, str], engine: Engine, partitions: int) -> dict[str, str]:
    """The operator's `spark.conf` with what `engine` needs added (lists joined; other keys: the operator's win)."""
    if engine != "delta-spark":
        return dict(conf)
    merged = {**session_conf(), _SNAPSHOT_PARTITIONS: str(partitions), **conf}
    for key in _LISTS:
        items = [i for value in (conf.get(key), session_conf().get(key)) if value for i in value.split(",")]
        if items:
            merged[key] = ",".join(dict.fromkeys(i.strip() for i in items))
    return merged


def _default_shuffle_partitions() -> int:
    return max(2, os.cpu_count() or 2)


def build_spark(settings: SparkSettings | None = None, quick_jit: bool = False,
                class_archive_out: Path | None = None, packed_state: bool = False,
                engine: Engine = "delta-rs") -> SparkSession:
    """Create (or return the running) SparkSession configured for the pipelines.

    Python workers run this interpreter so they can import the project; the state
    store is RocksDB so keyed state survives restarts with the checkpoint. `quick_jit`: the JVM
    does little per record (no stateful stage), so C1 compilation and a small heap are enough;
    otherwise a local JVM gets a young generation sized for stateful stages (see above), and with
    `packed_state` (only the bucket materializer is stateful) C1 compilation too. The driver's
    JVM maps the prepared class archive (`jvm_class_archive`); with `class_archive_out` it writes one
    there at exit instead. `engine`: the Delta engine of the tables (delta-spark adds its jars and conf).
    """
    settings = settings or SparkSettings()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if settings.master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    partitions = settings.shuffle_partitions or _default_shuffle_partitions()
    java_options = f"-Dlog4j.configurationFile=file:{_LOG4J_CONFIG}"
    if settings.master.startswith("local"):
        java_options += f" {_LIGHT_JVM_OPTIONS if quick_jit else _STATEFUL_JVM_OPTIONS}"
        java_options += f" {_C1_ONLY}" if packed_state and not quick_jit else ""
    archive = session_options() if class_archive_out is None else dump_options(class_archive_out)
    java_options += f" {archive}" if archive else ""
    builder = (
        SparkSession.builder.master(settings.master)
        .appName(settings.app_name)
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.default.parallelism", str(partitions))
        .config("spark.sql.streaming.stateStore.providerClass", _ROCKSDB_PROVIDER)
        .config(_CHANGELOG_CHECKPOINTING, "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.redaction.regex", _REDACTION)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.extraJavaOptions", java_options)
    )
    conf = _with_engine_conf(settings.conf, engine, partitions)
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as error:
        if engine == "delta-spark" and "spark.jars.packages" in conf:
            raise unresolved_failure(error) from None
        raise
    spark.sparkContext.setLogLevel(_QUIET_LOG_LEVEL)
    reason = missing_delta_reason(spark) if engine == "delta-spark" else None
    if reason is not None:
        raise DeltaSparkUnavailable(f"lakehouse.engine delta-spark: {reason}")
    return spark
