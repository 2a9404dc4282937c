"""The cluster Delta engine: delta-spark (`DeltaTable.merge`, `readChangeFeed`) on the JVM.

Same protocol (`engines.DeltaEngineTable`) and semantics as `DeltaRsTable`: one MERGE per
micro-batch built from the engine-neutral `merge_plan` (with `truncate`, WHEN NOT MATCHED BY
SOURCE THEN DELETE empties the rest of the table in the same commit), a source TRUNCATE with
no later change as one DELETE, commits carrying (app id, batch id) so a replayed batch is
skipped, tables created with the change data feed on, additive schema evolution.

Idempotence: Delta's session settings `spark.databricks.delta.write.txnAppId` and
`...write.txnVersion` make a MERGE or DELETE commit a SetTransaction action, and make Delta
skip the write when the table already holds that version or a later one for the app id. They are
session-wide, so each table writes through its own `SparkSession.newSession()` (own SQL
conf, shared SparkContext) and sets them only around its MERGE.

Reads of the log (schema, version, last committed batch) go through the delta-rs log
reader: Spark has no public API for a table's transaction versions, and one reader keeps
the Arrow types the sink conforms batches to identical across engines.

Column names: Delta refuses a space or any of `,;{}()=` and tabs or newlines in a column name
unless the table maps its columns (column mapping, which delta-rs cannot read the change feed
of), and quotes a name holding a backtick wrongly in the change feed a MERGE writes (Delta 4.4).
delta-rs stores all of them. So this engine refuses such names with `DeltaSchemaError` naming
them, before it writes anything. Log entries are never deleted as a side effect of a
commit (`delta.enableExpiredLogCleanup` false; Delta otherwise cleans up after every
checkpoint): only table maintenance does, after checking the exports (service/operations/maintenance.py).

The Delta jars must be on the JVM classpath (`session_conf()`: the jars resolved into the cache
by connectors/maven_jars.py, else the Maven package); without them the table refuses to open
with `DeltaSparkUnavailable` naming what is missing.
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence, TypeVar

import pyarrow as pa
from delta.tables import DeltaMergeBuilder, DeltaTable
from py4j.java_gateway import JavaClass, JavaObject, JVMView
from py4j.protocol import Py4JError, Py4JJavaError
from pyspark.errors import AnalysisException, PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql.functions import col
from pyspark.sql.pandas.types import from_arrow_schema

from connectors.delta.delta_rs import (
    CDF_ENABLED,
    DeltaCommitConflict,
    DeltaRsTable,
    DeltaSchemaError,
    DeltaWriteError,
    to_widen,
    widen_info,
)
from connectors.delta.merge_plan import DELETE_FLAG, KEEP_FLAG_PREFIX, MergePlan, plan_merge
from connectors.maven_jars import COMPONENTS, JarsUnavailable, is_resolved, lib_jars
from vocabulary.errors import TerminalError

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
DELTA_TABLE_CLASS = "io.delta.tables.DeltaTable"
_MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"
_OPTIMIZE_MAX_FILE_SIZE = "spark.databricks.delta.optimize.maxFileSize"
# The retention is checked against the table's readers by the caller (service/operations/vacuum_retention.py),
# in place of Delta's fixed floor of 7 days; VACUUM writes its START / END commits (files deleted).
_VACUUM_CONF = {"spark.databricks.delta.retentionDurationCheck.enabled": "false",
                "spark.databricks.delta.vacuum.logging.enabled": "true"}
# VACUUM repartitions the listing of the table's directory into this many partitions (Spark's default:
# 10000) and runs several jobs over them: 10000 tasks of a few files each, 50-130 s for a 10-file table on
# a loaded 2-core machine. The table's session sets the session's shuffle partitions instead (the size
# the operator gave the cluster), unless the operator set this key for the application.
_LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
_CONFLICT_PACKAGE = "io.delta.exceptions."
NO_LOG_CLEANUP_ON_COMMIT = {"delta.enableExpiredLogCleanup": "false"}
# Characters Delta refuses in column names unless the table maps them (DeltaColumnMapping), and the
# backtick, which Delta 4.4's MERGE quotes wrongly in the change feed it writes.
_UNSTORABLE = frozenset(" ,;{}()\n\t=`")
_T = TypeVar("_T")


class DeltaSparkUnavailable(TerminalError):
    """The Spark session cannot run delta-spark (jars not on the classpath, extension not set)."""


def delta_artifact() -> str:
    """Maven coordinates of the Delta jar (the `delta` component of connectors/maven_jars.py)."""
    return COMPONENTS["delta"].dependencies[0]


def delta_spark_conf(jars: Sequence[str] = ()) -> dict[str, str]:
    """Spark settings for delta-spark: local `jars` when given, else the Maven package."""
    conf = {"spark.sql.extensions": DELTA_EXTENSION, "spark.sql.catalog.spark_catalog": DELTA_CATALOG}
    if jars:
        conf["spark.jars"] = ",".join(jars)
    else:
        conf["spark.jars.packages"] = delta_artifact()
    return conf


def session_conf() -> dict[str, str]:
    """Spark settings for a new session running delta-spark: the jars of the cache when they are
    resolved (no network at start), else the Maven package (Spark resolves it with Ivy)."""
    return delta_spark_conf([str(jar) for jar in lib_jars("delta")] if is_resolved("delta") else ())


def unresolved_failure(error: BaseException) -> DeltaSparkUnavailable:
    """The error to raise when a session given `spark.jars.packages` (jars not in the cache) failed to start."""
    return DeltaSparkUnavailable(
        f"Spark did not start with spark.jars.packages={delta_artifact()} ({_reason(error)}; Spark's output above "
        f"says why: most often Maven Central cannot be reached) and {_cache_fix()}"
    )


def _cache_fix() -> str:
    """How to put the Delta jars into the cache (the jar cache's own words)."""
    try:
        lib_jars("delta")
    except JarsUnavailable as missing:
        return str(missing)
    return "the Delta jars are in the cache"


def unstorable_names(names: Sequence[str]) -> list[str]:
    """The names among `names` delta-spark cannot write (see the module's text)."""
    return [name for name in dict.fromkeys(names) if _UNSTORABLE.intersection(name)]


def _refuse_unstorable(uri: str, names: Sequence[str]) -> None:
    unstorable = unstorable_names(names)
    if unstorable:
        raise DeltaSchemaError(
            f"table {uri}: delta-spark cannot write columns named {unstorable} (Delta refuses a space or any of "
            "',;{}()=' in a column name without column mapping, whose change feed delta-rs cannot read, and "
            "Delta 4.4's MERGE writes a wrong change feed for a backtick); rename them or use lakehouse.engine delta-rs"
        )


def _quoted(name: str) -> str:
    """A column name as one identifier (dots and the like taken literally)."""
    return "`" + name.replace("`", "``") + "`"


def txn_conf(app_id: str, batch_id: int) -> dict[str, str]:
    """Session settings that make the next Delta write idempotent under (app id, batch id)."""
    if batch_id < 0:
        raise ValueError(f"batch id must be >= 0, got {batch_id}")
    return {TXN_APP_ID_CONF: app_id, TXN_VERSION_CONF: str(int(batch_id))}


def _class_loaded(spark: SparkSession, name: str) -> bool:
    """True when the JVM behind `spark` can load class `name` (py4j: a JavaClass, not a package)."""
    node = spark._jvm
    try:
        for part in name.split("."):
            node = getattr(node, part)
    except Py4JError:
        return False
    return isinstance(node, JavaClass)


def missing_delta_reason(spark: SparkSession) -> str | None:
    """Why `spark` cannot run delta-spark, or None when it can."""
    if getattr(spark, "_jvm", None) is None:
        return "the Spark session has no local JVM (Spark Connect); delta-spark needs a classic session"
    if not _class_loaded(spark, DELTA_TABLE_CLASS):
        return (
            f"the Delta Lake jars are not on the Spark classpath (class {DELTA_TABLE_CLASS} not found); "
            f"start Spark with the jars in spark.jars or with spark.jars.packages={delta_artifact()} "
            f"(service/runtime/spark_session.py build_spark does either for lakehouse.engine delta-spark); {_cache_fix()}"
        )
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    if DELTA_EXTENSION not in extensions:
        return f"spark.sql.extensions does not include {DELTA_EXTENSION}"
    return None


def _reason(error: BaseException) -> str:
    """The error's class and condition only: Spark messages may quote row values."""
    if isinstance(error, Py4JJavaError):
        return str(error.java_exception.getClass().getName())
    condition = error.getCondition() if isinstance(error, PySparkException) else None
    return f"{type(error).__name__} ({condition})" if condition else type(error).__name__


def _is_conflict(error: BaseException) -> bool:
    """Whether a failed Delta operation lost a race with another writer (Delta's concurrent
    modification exceptions, as Py4J or as PySpark hands them over)."""
    if isinstance(error, Py4JJavaError):
        return str(error.java_exception.getClass().getName()).startswith(_CONFLICT_PACKAGE)
    condition = error.getCondition() if isinstance(error, PySparkException) else None
    return bool(condition) and "CONCURRENT" in str(condition)


def normalize_cdf(table: pa.Table) -> pa.Table:
    """Change-feed rows with plain types: string for string views, UTC microsecond timestamps."""
    fields = []
    for field in table.schema:
        kind = field.type
        if pa.types.is_string_view(kind) or pa.types.is_large_string(kind):
            kind = pa.string()
        elif pa.types.is_timestamp(kind) and kind.tz is not None:
            kind = pa.timestamp("us", tz="UTC")
        fields.append(field.with_type(kind))
    return table.cast(pa.schema(fields, metadata=table.schema.metadata))


class DeltaSparkTable:
    """One Delta table written by delta-spark; the same public methods as `DeltaRsTable`."""

    def __init__(self, spark: SparkSession, uri: str, storage_options: dict[str, str] | None = None,
                 properties: dict[str, str] | None = None) -> None:
        reason = missing_delta_reason(spark)
        if reason is not None:
            raise DeltaSparkUnavailable(f"cannot open {uri} with delta-spark: {reason}")
        self.uri = uri
        self.storage_options = storage_options or None
        self._session = spark.newSession()
        # The MERGE source is an Arrow table held by the driver: deterministic, so Delta need not copy
        # it before its two passes (a 2-row MERGE on a loaded 2-core machine: ~1 s less).
        self._session.conf.set(_MATERIALIZE_SOURCE, "none")
        self._log = DeltaRsTable(uri, storage_options)
        self._properties = {**CDF_ENABLED, **NO_LOG_CLEANUP_ON_COMMIT, **(properties or {})}
        self._lock = threading.Lock()
        self._log_kept = False

    def schema(self) -> pa.Schema | None:
        """The table's Arrow schema, or None when the table does not exist yet."""
        return self._log.schema()

    def last_batch(self, app_id: str) -> int | None:
        """The highest batch id committed under `app_id`, if any."""
        return self._log.last_batch(app_id)

    def version(self) -> int | None:
        """Current table version, or None when the table does not exist."""
        return self._log.version()

    def rows_with_keys(self, keys: pa.Table) -> pa.Table:
        """The stored rows whose values of `keys`' columns are one of its rows (a semi join in Spark)."""
        if self.schema() is None:
            return pa.table({})
        stored = self._session.read.format("delta").load(self.uri)
        wanted = self._session.createDataFrame(keys)
        return self._run(f"read rows of {self.uri} by key",
                         lambda: stored.join(wanted, on=list(keys.column_names), how="left_semi").toArrow())

    def configuration(self) -> dict[str, str]:
        """The table's properties (empty when the table does not exist), from its log."""
        return self._log.configuration()

    def create(self, schema: pa.Schema, partition_by: tuple[str, ...] = (), cluster_by: tuple[str, ...] = ()) -> None:
        """Create the table (change data feed on, partitioned by `partition_by` or liquid-clustered by
        `cluster_by`) unless it exists."""
        _refuse_unstorable(self.uri, schema.names)
        builder = DeltaTable.createIfNotExists(self._session).location(self.uri)
        builder = builder.addColumns(from_arrow_schema(schema))
        if partition_by:
            builder = builder.partitionedBy(*partition_by)
        if cluster_by:
            builder = builder.clusterBy(*cluster_by)
        for key, value in self._properties.items():
            builder = builder.property(key, value)
        self._run(f"create {self.uri}", builder.execute)

    def create_with(self, changes: pa.Table, primary_key: tuple[str, ...], app_id: str, batch_id: int) -> None:
        """Create the table (without the merge flags' columns), then MERGE the batch into it."""
        flags = [n for n in changes.column_names if n == DELETE_FLAG or n.startswith(KEEP_FLAG_PREFIX)]
        self.create(changes.drop_columns(flags).schema)
        self.merge(changes, primary_key, app_id, batch_id)

    def truncate(self, app_id: str, batch_id: int) -> None:
        """Delete every row, committed with the batch's application transaction."""
        if self.schema() is None:
            return
        with self._lock:
            self._keep_log_on_commit()
            with self._transaction(app_id, batch_id):
                self._run(f"truncate {self.uri}", lambda: DeltaTable.forPath(self._session, self.uri).delete())

    def merge(
        self, changes: pa.Table, primary_key: tuple[str, ...], app_id: str, batch_id: int, truncate: bool = False
    ) -> None:
        """Apply net changes: delete where flagged, update where matched, insert where new;
        with `truncate`, also delete every stored row the batch does not match."""
        existing = self.schema()
        if existing is None:
            raise DeltaSchemaError(f"table {self.uri} does not exist; create it first")
        plan = plan_merge(changes.schema, primary_key, existing)
        _refuse_unstorable(self.uri, [*existing.names, *(f.name for f in plan.new_columns)])
        with self._lock:
            self._keep_log_on_commit()
            if plan.new_columns:
                self._add_columns(plan.new_columns)
            with self._transaction(app_id, batch_id):
                self._run(f"MERGE into {self.uri}",
                          lambda: self._builder(plan, self._session.createDataFrame(changes), truncate).execute())

    def widen(self, columns: dict[str, pa.DataType], app_id: str, batch_id: int) -> None:
        """Give `columns` the wider types they map to, in one commit before the batch's MERGE: the table
        is rewritten with the columns cast (an overwrite with `overwriteSchema`). Not Delta's in-place
        type widening: its `typeWidening` reader feature makes the table unreadable to delta-rs (1.x),
        which reads this engine's change feeds for exports and its tables for `rebuild-state`. No
        application transaction: a batch replayed after this commit still merges, and widens nothing."""
        current = self.schema()
        if current is None:
            raise DeltaSchemaError(f"widen of {self.uri}: the table does not exist")
        wanted = to_widen(self.uri, current, columns)
        if not wanted:
            return
        spark_types = from_arrow_schema(pa.schema([pa.field(name, kind) for name, kind in wanted.items()]))
        with self._lock:
            self._keep_log_on_commit()
            frame = self._session.read.format("delta").load(self.uri)
            frame = frame.select(*[
                col(_quoted(name)).cast(spark_types[name].dataType).alias(name) if name in wanted else col(_quoted(name))
                for name in frame.columns
            ])
            writer = (frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
                      .option("userMetadata", json.dumps(widen_info(wanted, app_id, batch_id))))
            self._run(f"widen columns {sorted(wanted)} of {self.uri}", lambda: writer.save(self.uri))

    def load_cdf(self, starting_version: int, ending_version: int | None = None) -> pa.Table:
        """Change-feed rows of versions [starting_version, ending_version] (to the latest if None)."""
        reader = (
            self._session.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", str(starting_version))
        )
        if ending_version is not None:
            reader = reader.option("endingVersion", str(ending_version))
        return normalize_cdf(self._run(f"read the change feed of {self.uri}", lambda: reader.load(self.uri).toArrow()))

    def _builder(self, plan: MergePlan, source: DataFrame, truncate: bool) -> DeltaMergeBuilder:
        target = DeltaTable.forPath(self._session, self.uri).alias(plan.target_alias)
        updates: dict[str, str | Column] = dict(plan.update.mapping())
        inserts: dict[str, str | Column] = dict(plan.insert.mapping())
        builder = (
            target.merge(source.alias(plan.source_alias), plan.predicate)
            .whenMatchedDelete(condition=plan.delete.condition)
            .whenMatchedUpdate(condition=plan.update.condition, set=updates)
            .whenNotMatchedInsert(condition=plan.insert.condition, values=inserts)
        )
        return builder.whenNotMatchedBySourceDelete() if truncate else builder

    def _add_columns(self, fields: Sequence[pa.Field]) -> None:
        """Additive schema change in its own commit (no data): an empty append with mergeSchema."""
        empty = self._session.createDataFrame([], from_arrow_schema(pa.schema(fields)))
        writer = empty.write.format("delta").mode("append").option("mergeSchema", "true")
        self._run(f"add columns {[f.name for f in fields]} to {self.uri}", lambda: writer.save(self.uri))

    def _keep_log_on_commit(self) -> None:
        """Turn off Delta's log cleanup after commits once per opened table (a table another engine
        created may lack the setting); only maintenance deletes log entries."""
        if not self._log_kept:
            self._set_properties(NO_LOG_CLEANUP_ON_COMMIT)
            self._log_kept = True

    # --- maintenance (service/operations/maintenance.py decides when, and checks the exports first) ---

    def compact(self, z_order_by: tuple[str, ...] = (), target_size: int | None = None) -> tuple[int, int]:
        """Delta's OPTIMIZE (ZORDER BY `z_order_by` when given) in one commit without data change;
        returns (files removed, files added)."""
        if target_size is not None:
            self._session.conf.set(_OPTIMIZE_MAX_FILE_SIZE, str(target_size))
        optimize = DeltaTable.forPath(self._session, self.uri).optimize()
        with self._lock:
            result = self._run(
                f"OPTIMIZE of {self.uri}",
                lambda: (optimize.executeZOrderBy(*z_order_by) if z_order_by else optimize.executeCompaction()).collect(),
            )
        metrics = result[0]["metrics"]
        return int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"])

    def checkpoint(self) -> int:
        """A log checkpoint at the current version. Delta deletes expired log entries after every
        checkpoint unless the table says not to, so that is said first."""
        with self._lock:
            self._keep_log_on_commit()
            log, snapshot = self._delta_log()
            self._run(f"checkpoint of {self.uri}", lambda: log.checkpoint(snapshot, self._none()))
            return int(snapshot.version())

    def cleanup_logs(self) -> None:
        """Delete log entries older than the table's `delta.logRetentionDuration` before the last
        checkpoint (Delta's own cleanup, which it otherwise runs after a checkpoint)."""
        with self._lock:
            log, snapshot = self._delta_log()
            granularity = getattr(log, "cleanUpExpiredLogs$default$4")()  # Delta's default: by day
            self._run(f"log cleanup of {self.uri}",
                      lambda: log.cleanUpExpiredLogs(snapshot, self._none(), self._none(), granularity))

    def vacuum(self, retention_hours: int) -> int:
        """Delta's VACUUM with `retention_hours` (no floor of its own); returns how many files it deleted
        (from its VACUUM END commit)."""
        for key, value in _VACUUM_CONF.items():
            self._session.conf.set(key, value)
        if not self._session.sparkContext.getConf().contains(_LISTING_PARALLELISM):
            partitions = self._session.conf.get("spark.sql.shuffle.partitions") or "200"  # always set; 200: its default
            self._session.conf.set(_LISTING_PARALLELISM, partitions)
        table = DeltaTable.forPath(self._session, self.uri)
        with self._lock:
            self._run(f"VACUUM of {self.uri}", lambda: table.vacuum(float(retention_hours)))
        ends = [commit for commit in self._log.history(3) if commit.get("operation") == "VACUUM END"]
        return int((ends[0].get("operationMetrics") or {}).get("numDeletedFiles", 0)) if ends else 0

    def _delta_log(self) -> tuple[JavaObject, JavaObject]:
        """Delta's log of the table (JVM) and its snapshot at the latest version."""
        log = self._jvm().org.apache.spark.sql.delta.DeltaLog.forTable(self._session._jsparkSession, self.uri)
        return log, log.update(False, self._none(), self._none())

    def _none(self) -> JavaObject:
        return self._jvm().scala.Option.empty()

    def _jvm(self) -> JVMView:
        jvm = self._session._jvm
        assert jvm is not None, "checked when the table was opened (missing_delta_reason)"
        return jvm

    def _set_properties(self, properties: dict[str, str]) -> None:
        """Table properties set in one commit, unless the table already has them."""
        configuration = self._log.configuration()
        if all(configuration.get(key) == value for key, value in properties.items()):
            return
        pairs = ", ".join(f"'{key}' = '{value}'" for key, value in properties.items())
        location = self.uri.replace("`", "``")
        self._run(f"set {sorted(properties)} on {self.uri}",
                  lambda: self._session.sql(f"ALTER TABLE delta.`{location}` SET TBLPROPERTIES ({pairs})"))

    @contextmanager
    def _transaction(self, app_id: str, batch_id: int) -> Iterator[None]:
        # Set only around one write: any other write in this session would carry the txn too.
        settings = txn_conf(app_id, batch_id)
        for key, value in settings.items():
            self._session.conf.set(key, value)
        try:
            yield
        finally:
            for key in settings:
                self._session.conf.unset(key)

    def _run(self, what: str, action: Callable[[], _T]) -> _T:
        """`action` through Spark, its errors as the engine's; the log's handle then reads the log again
        (the action may have committed)."""
        try:
            return action()
        except AnalysisException as error:
            raise DeltaSchemaError(f"{what} failed: {_reason(error)}") from None
        except (PySparkException, Py4JJavaError) as error:
            if _is_conflict(error):
                raise DeltaCommitConflict(f"{what} conflicted with another commit: {_reason(error)}") from None
            raise DeltaWriteError(f"{what} failed: {_reason(error)}") from None
        finally:
            self._log.changed_elsewhere()
