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
from service.runtime.checkpoints import local_path
from service.runtime.jvm_class_archive import dump_options, session_options
from service.runtime.jvm_profiles import STATEFUL, JvmProfile
from service.runtime.project_code import ship

_ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_QUIET_LOG_LEVEL = "ERROR"
# Spark masks option and conf values whose keys match this in logs, plans and the UI; it covers
# every key `settings.is_secret_key` hides (tests/integration/service/config/test_secrets.py).
_REDACTION = r"(?i)secret|password|token|access[.]?key|jaas|credential|key[.]pem|oauthbearer[.]config"
_LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
# A state store commit writes what changed to a changelog file instead of flushing RocksDB and copying
# its new files into the checkpoint; a background task snapshots every few versions. Spark switches an
# existing checkpoint either way (figures: docs/design/runtime-tuning.md).
_CHANGELOG_CHECKPOINTING = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
# Spark writes a checkpoint's log entries and state changelogs through Hadoop's FileContext by default; on a
# local filesystem (no Hadoop native library here) it starts a `chmod` for every file it creates and `readlink`s
# for every rename: about 25 processes a micro-batch, 30-50 ms on each offset-log and commit-log entry and on
# each state store commit. Spark's own FileSystem-based manager (its fallback for schemes without FileContext:
# write a temporary file, rename it into place) starts none (docs/design/runtime-tuning.md).
CHECKPOINT_FILE_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
FILE_SYSTEM_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
# Comma-separated settings an engine's conf and the operator's `spark.conf` both add to.
_LISTS = ("spark.jars", "spark.jars.packages", "spark.sql.extensions")
# Delta rebuilds a table's state from its log in this many partitions (Delta's default 50; with adaptive
# execution off nothing merges them): the session's shuffle partitions instead (docs/design/runtime-tuning.md).
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


def _java_options(settings: SparkSettings, jvm: JvmProfile, class_archive_out: Path | None) -> str:
    """The driver JVM's options: the log configuration; on a local master the profile's flags; the class
    archive to map (or, with `class_archive_out`, to write there at exit)."""
    java_options = f"-Dlog4j.configurationFile=file:{_LOG4J_CONFIG}"
    if settings.master.startswith("local"):
        java_options += f" {jvm.options}"
    archive = session_options() if class_archive_out is None else dump_options(class_archive_out)
    return java_options + (f" {archive}" if archive else "")


def spark_conf(settings: SparkSettings, jvm: JvmProfile = STATEFUL, class_archive_out: Path | None = None,
               engine: Engine = "delta-rs", checkpoint_root: str | None = None) -> dict[str, str]:
    """Every setting `build_spark` gives the session (the operator's `spark.conf` last, so it wins).
    `checkpoint_root`: where the queries' checkpoints are (None: not known)."""
    partitions = settings.shuffle_partitions or _default_shuffle_partitions()
    conf = {
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.default.parallelism": str(partitions),
        "spark.sql.streaming.stateStore.providerClass": _ROCKSDB_PROVIDER,
        _CHANGELOG_CHECKPOINTING: "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.redaction.regex": _REDACTION,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.adaptive.enabled": "false",
        "spark.python.worker.reuse": "true",
        "spark.driver.extraJavaOptions": _java_options(settings, jvm, class_archive_out),
    }
    if checkpoint_root is not None and local_path(checkpoint_root) is not None:
        conf[CHECKPOINT_FILE_MANAGER] = FILE_SYSTEM_MANAGER
    return {**conf, **_with_engine_conf(settings.conf, engine, partitions)}


def build_spark(settings: SparkSettings | None = None, jvm: JvmProfile = STATEFUL,
                class_archive_out: Path | None = None, engine: Engine = "delta-rs",
                checkpoint_root: str | None = None) -> SparkSession:
    """Create (or return the running) SparkSession configured for the pipelines.

    Python workers run this interpreter so they can import the project; the state
    store is RocksDB so keyed state survives restarts with the checkpoint. `jvm`: the local driver
    JVM's flags (`jvm_profiles.jvm_profile` chooses them from the compiled plan). The driver's
    JVM maps the prepared class archive (`jvm_class_archive`); with `class_archive_out` it writes one
    there at exit instead. `engine`: the Delta engine of the tables (delta-spark adds its jars and conf).
    `checkpoint_root`: where the queries' checkpoints are (local: written without starting processes).
    On a cluster the project's code goes to the executors with the session (`project_code`).
    """
    settings = settings or SparkSettings()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if settings.master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    conf = spark_conf(settings, jvm, class_archive_out, engine, checkpoint_root)
    builder = SparkSession.builder.master(settings.master).appName(settings.app_name)
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
    ship(spark)
    return spark
