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

The Delta jars must be on the JVM classpath (`delta_spark_conf()`); without them the
table refuses to open with `DeltaSparkUnavailable` naming what is missing.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Callable, Iterator, Sequence, TypeVar

import pyarrow as pa
import pyspark
from delta.tables import DeltaMergeBuilder, DeltaTable
from py4j.java_gateway import JavaClass
from py4j.protocol import Py4JError, Py4JJavaError
from pyspark.errors import AnalysisException, PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from connectors.delta.delta_rs import CDF_ENABLED, DeltaRsTable, DeltaSchemaError, DeltaWriteError
from connectors.delta.merge_plan import MergePlan, plan_merge
from service.errors import TerminalError

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
DELTA_TABLE_CLASS = "io.delta.tables.DeltaTable"
_SCALA_VERSION = "2.13"
_T = TypeVar("_T")


class DeltaSparkUnavailable(TerminalError):
    """The Spark session cannot run delta-spark (jars not on the classpath, extension not set)."""


def delta_artifact() -> str:
    """Maven coordinates of the Delta jar matching the installed delta-spark and pyspark."""
    try:
        delta_version = version("delta_spark")
    except PackageNotFoundError:
        raise DeltaSparkUnavailable("the delta-spark Python package is not installed") from None
    spark_major_minor = ".".join(pyspark.__version__.split(".")[:2])
    return f"io.delta:delta-spark_{spark_major_minor}_{_SCALA_VERSION}:{delta_version}"


def delta_spark_conf(jars: Sequence[str] = ()) -> dict[str, str]:
    """Spark settings for delta-spark: local `jars` when given, else the Maven package."""
    conf = {"spark.sql.extensions": DELTA_EXTENSION, "spark.sql.catalog.spark_catalog": DELTA_CATALOG}
    if jars:
        conf["spark.jars"] = ",".join(jars)
    else:
        conf["spark.jars.packages"] = delta_artifact()
    return conf


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
            f"start Spark with spark.jars.packages={delta_artifact()} (needs Maven access) "
            "or with the jars in spark.jars"
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

    def __init__(self, spark: SparkSession, uri: str, storage_options: dict[str, str] | None = None) -> None:
        reason = missing_delta_reason(spark)
        if reason is not None:
            raise DeltaSparkUnavailable(f"cannot open {uri} with delta-spark: {reason}")
        self.uri = uri
        self.storage_options = storage_options or None
        self._session = spark.newSession()
        self._log = DeltaRsTable(uri, storage_options)
        self._lock = threading.Lock()

    def schema(self) -> pa.Schema | None:
        """The table's Arrow schema, or None when the table does not exist yet."""
        return self._log.schema()

    def last_batch(self, app_id: str) -> int | None:
        """The highest batch id committed under `app_id`, if any."""
        return self._log.last_batch(app_id)

    def version(self) -> int | None:
        """Current table version, or None when the table does not exist."""
        return self._log.version()

    def create(self, schema: pa.Schema) -> None:
        """Create the table (change data feed on) unless it exists."""
        builder = DeltaTable.createIfNotExists(self._session).location(self.uri)
        builder = builder.addColumns(from_arrow_schema(schema))
        for key, value in CDF_ENABLED.items():
            builder = builder.property(key, value)
        self._run(f"create {self.uri}", builder.execute)

    def truncate(self, app_id: str, batch_id: int) -> None:
        """Delete every row, committed with the batch's application transaction."""
        if self.schema() is None:
            return
        with self._lock, self._transaction(app_id, batch_id):
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
        with self._lock:
            if plan.new_columns:
                self._add_columns(plan.new_columns)
            with self._transaction(app_id, batch_id):
                self._run(f"MERGE into {self.uri}",
                          lambda: self._builder(plan, self._session.createDataFrame(changes), truncate).execute())

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
        try:
            return action()
        except AnalysisException as error:
            raise DeltaSchemaError(f"{what} failed: {_reason(error)}") from None
        except (PySparkException, Py4JJavaError) as error:
            raise DeltaWriteError(f"{what} failed: {_reason(error)}") from None
