"""A pipeline's `columns:` (service/config/columns.py) applied to its typed net changes with Spark SQL.

Each micro-batch's typed net changes (the columns `rows.names.Meta` names, then the row's) are handed to
Spark as one Arrow batch (a local relation in the driver's JVM) and come back through one projection,
evaluated by Spark's expressions (no Python per row). Spark's optimizer evaluates a projection of a local
relation while it plans it (its rule ConvertToLocalRelation), so the projected rows are read back from the
planned local table scan and turned into Arrow in the driver's JVM, served on a local socket as Spark serves
a collect: no Spark job runs (`collected`). A batch too large for a local relation
(`spark.sql.execution.arrow.localRelationThreshold`) or a projection the optimizer does not fold is
collected with `toArrow`, a Spark job (`collected_by_job`); a test holds the two equal.

- the filter: an upsert whose image fails it (false or null) becomes a delete of its key; deletes stay;
- computed columns: the expressions over the image (null for a delete), after the kept source columns;
- masked columns: `sha2(salt || CAST(value AS STRING), 256)` (null stays null), deletes included, so a
  masked primary key still matches its row;
- include / exclude: the source columns kept (the key always); the unchanged-column lists (TOAST
  placeholders) are cut to the kept columns, so a dropped column never comes back through them.

`check_expressions` compiles every expression with Spark's parser when the pipeline starts; an
expression the batch's columns cannot resolve fails the batch with an error naming the pipeline, the
column and the table.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.errors import AnalysisException, ParseException
from pyspark.serializers import read_int
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.util import _create_local_socket

from service.config.columns import ColumnSettings
from service.config.settings import PipelineSettings
from service.config.sources import mask_salt
from service.kafka_to_delta.materialize.payload import HISTORY_META
from service.kafka_to_delta.rows.names import Meta
from service.kafka_to_delta.sink.merge_sink import MergeOutcome, MergeSink
from vocabulary.changes import ChangeKind
from vocabulary.errors import ConfigError, TerminalError

FILTER = "filter"
"""How errors name the row filter (a computed column is named by its name)."""


class ColumnRules:
    """One pipeline's `columns:` as a Spark projection of its typed net changes."""

    def __init__(self, spark: SparkSession, pipeline: PipelineSettings, table: str) -> None:
        assert pipeline.columns is not None
        self.spark = spark
        self.settings: ColumnSettings = pipeline.columns
        self.primary_key = pipeline.primary_key
        self.where = f"pipeline {pipeline.name} (table {table}): columns"
        salt_env = self.settings.salt_env
        self.salt = mask_salt(salt_env, self.where) if self.settings.mask and salt_env else None
        self.check_expressions()

    def expressions(self) -> dict[str, str]:
        """Every expression by the name errors give it: computed columns, then the filter."""
        named = dict(self.settings.computed)
        if self.settings.filter is not None:
            named[FILTER] = self.settings.filter
        return named

    def check_expressions(self) -> None:
        """Compile every expression with Spark's parser; `ConfigError` naming the pipeline and the column."""
        parser = self.spark._jsparkSession.sessionState().sqlParser()  # type: ignore[union-attr]
        for name, text in self.expressions().items():
            try:
                parser.parseExpression(text)
            except Exception as error:  # a Py4J error wrapping Spark's ParseException
                message = str(error).splitlines()[0] if str(error) else type(error).__name__
                raise ConfigError(f"{self.where}: {name}: {text!r} does not compile: {message}") from None

    def _mask(self, column: Column, name: str) -> Column:
        if name not in self.settings.mask:
            return column
        return F.sha2(F.concat(F.lit(self.salt), column.cast("string")), 256).alias(name)

    def projection(self, columns: list[str], meta_columns: tuple[str, ...] = Meta.ALL) -> list[Column]:
        """The select list for typed net changes with `columns`: kept source columns, computed ones, meta columns
        (`meta_columns`: those of the net changes, or of a history part's row changes)."""
        deleted = F.col(Meta.KIND) == F.lit(ChangeKind.DELETE.value)
        kind = F.col(Meta.KIND)
        if self.settings.filter is not None:
            passes = F.coalesce(F.expr(self.settings.filter).cast("boolean"), F.lit(False))
            kind = F.when(~deleted & ~passes, F.lit(ChangeKind.DELETE.value)).otherwise(kind)
        data = [c for c in columns if c not in meta_columns]
        kept = [c for c in data if self.settings.keeps(c, self.primary_key)]
        unchanged = F.col(Meta.UNCHANGED)
        if len(kept) < len(data):
            listed = F.from_json(unchanged, "array<string>")
            names = F.array(*[F.lit(c) for c in kept]) if kept else F.array().cast("array<string>")
            cut = F.to_json(F.filter(listed, lambda c: F.array_contains(names, c)))
            unchanged = F.when(unchanged.isNull(), F.lit(None)).otherwise(cut)
        meta = [kind.alias(Meta.KIND) if c == Meta.KIND else unchanged.alias(c) if c == Meta.UNCHANGED else F.col(c)
                for c in columns if c in meta_columns]
        source = [self._mask(F.col(f"`{c}`"), c).alias(c) for c in kept]
        computed = [self._mask(F.when(deleted, F.lit(None)).otherwise(F.expr(text)), name).alias(name)
                    for name, text in self.settings.computed.items()]
        return source + computed + meta

    def apply(self, changes: pa.Table, table_uri: str, meta_columns: tuple[str, ...] = Meta.ALL) -> pa.Table:
        """`changes` (typed net changes) filtered, computed, masked and projected."""
        if changes.num_rows == 0:
            return changes
        frame = self.spark.createDataFrame(changes)
        try:
            projected = frame.select(*self.projection(changes.column_names, meta_columns))
        except (AnalysisException, ParseException) as error:
            raise self._analysis_error(frame, table_uri, error) from None
        return collected(projected)

    def apply_to_history(self, rows: pa.Table, table_uri: str) -> pa.Table:
        """A history part's row changes (`BatchChanges.history`: each change's image, before images included)
        with the kept source columns, masked: the history table holds what the current-row table holds. Only
        `include` / `exclude` / `mask` come with a history (validation refuses `computed` and `filter`)."""
        return self.apply(rows, table_uri, HISTORY_META)

    def _analysis_error(self, frame: DataFrame, table_uri: str, error: Exception) -> TerminalError:
        """The error naming the expression the batch's columns cannot resolve."""
        for name, text in self.expressions().items():
            try:
                frame.select(F.expr(text)).schema
            except (AnalysisException, ParseException) as own:
                return ConfigError(f"{self.where}: {name}: {text!r} cannot be evaluated on table {table_uri}'s "
                                   f"batch (columns {[c for c in frame.columns if c not in Meta.ALL]}): "
                                   f"{str(own).splitlines()[0]}")
        return ConfigError(f"{self.where}: the projection cannot be evaluated on table {table_uri}: {error}")


_LOCAL_SCAN = "LocalTableScanExec"
_MAX_BATCH_ROWS = 65_536
_MAX_BATCH_BYTES = 64 << 20


def collected_by_job(frame: DataFrame) -> pa.Table:
    """`frame`'s rows as Arrow, through a Spark job (the reference for `collected`)."""
    return frame.toArrow()


def collected(frame: DataFrame) -> pa.Table:
    """`frame`'s rows as Arrow: read from its planned local table scan in the driver's JVM when the optimizer
    folded the plan into one (no Spark job), else `collected_by_job`. The JVM turns the rows into Arrow IPC
    streams and serves them on a local socket, as Spark serves a collect. Types as `DataFrame.toArrow` gives
    them."""
    plan = frame._jdf.queryExecution().executedPlan()
    if plan.getClass().getSimpleName() != _LOCAL_SCAN:
        return collected_by_job(frame)
    spark = frame.sparkSession
    large = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"
    jvm: Any = spark._jvm  # type: ignore[attr-defined]
    converters = getattr(getattr(jvm.org.apache.spark.sql.execution.arrow, "ArrowConverters$"), "MODULE$")
    batches = converters.toBatchWithSchemaIterator(plan.rows().iterator(), frame._jdf.schema(), _MAX_BATCH_ROWS,
                                                   _MAX_BATCH_BYTES, "UTC", True, large)
    schema = to_arrow_schema(frame.schema, error_on_duplicated_field_names_in_struct=True, timezone="UTC",
                             prefers_large_types=large)
    stream, sock = _create_local_socket(jvm.org.apache.spark.api.python.PythonRDD.serveIterator(
        batches, "columns projection"))
    tables = []
    try:
        while True:
            try:
                size = read_int(stream)
            except EOFError:
                break
            tables.append(pa.ipc.open_stream(stream.read(size)).read_all())
    finally:
        stream.close()
        sock.close()
    if not tables:
        return schema.empty_table()
    return pa.concat_tables(tables).cast(schema)


class ColumnRulesSink(MergeSink):
    """A MERGE sink (`sink`'s table and settings) whose typed net changes pass through a pipeline's
    `ColumnRules` first."""

    def __init__(self, sink: MergeSink, rules: ColumnRules) -> None:
        self.__dict__.update(sink.__dict__)
        self.rules = rules

    def apply_typed(self, changes: pa.Table, app_id: str, batch_id: int, truncate: bool = False) -> MergeOutcome:
        """`MergeSink.apply_typed` of the changes filtered, computed, masked and projected."""
        if self.already_committed(app_id, batch_id):
            return MergeOutcome(batch_id, 0, 0, skipped_replay=True)
        return super().apply_typed(self.rules.apply(changes, self.table.uri), app_id, batch_id, truncate)
