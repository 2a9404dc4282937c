"""A batch against the table's schema: what a source schema change does, per `schema_changes` policy.

The batch's column types come from its records' schema blocks (or their values); the table has its
own. Per column, `conform` casts the batch to the table's type, keeps a new column, or asks for the
table's column to be widened before the MERGE (`Conformed.widen`), as the policy says:

| change in the source                 | evolve             | lenient                     | ignore               | fail        |
|--------------------------------------|--------------------|-----------------------------|----------------------|-------------|
| new column (ADD, or a RENAME's name) | added by the MERGE | added by the MERGE          | dropped              | stop        |
| column no longer sent (DROP, RENAME) | kept, nulls        | kept, nulls                 | kept, nulls          | kept, nulls |
| wider type (`widens`)                | table widened      | widened if a value needs it | cast, stop on misfit | stop        |
| narrower type                        | cast (always fits) | cast (always fits)          | cast (always fits)   | stop        |
| other type (int -> text, scale down) | stop               | cast, stop on misfit        | cast, stop on misfit | stop        |

A column the batch lacks cannot be told from a dropped one (a partial delete, an unchanged TOAST
value), so every policy keeps it in the table. A column whose values are all null in the batch
says nothing about its type and fits any. Every stop is a `DeltaSchemaError` naming the table, the
column, both types and, when the rows' `Meta` columns are given, the first record concerned (topic,
partition, offset, key; never a value). Widening loses nothing, so `lenient` applies it like
`evolve`; a value that does not fit stops the pipeline rather than dropping the record (the sink
holds net changes, not the records' bytes a dead letter needs). `evolve` widens as soon as the
source's type is wider; `lenient` only once a value needs it (widening rewrites the table, and
records without a schema block type every integer as int64).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from connectors.delta.arrow_types import plain_type, widens
from connectors.delta.delta_rs import DeltaSchemaError
from service.config.choices import SchemaChanges
from service.kafka_to_delta.rows.names import Meta
from vocabulary.errors import SourceCoordinates

_CAST_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)


@dataclass(frozen=True)
class Conformed:
    """The batch in the table's types, and the table columns to widen (name -> new type) first."""

    batch: pa.Table
    widen: dict[str, pa.DataType] = field(default_factory=dict)


def _coordinates(meta: pa.Table | None, index: int) -> str:
    if meta is None or index >= meta.num_rows:
        return ""
    row = meta.slice(index, 1).select([Meta.TOPIC, Meta.PARTITION, Meta.OFFSET, Meta.KEY]).to_pylist()[0]
    return f" (first at {SourceCoordinates(*row.values())})"


def _first_value(column: pa.ChunkedArray, meta: pa.Table | None) -> str:
    """Where the first record with a value in `column` came from."""
    if meta is None:
        return ""
    valid = pc.is_valid(column)
    index = pc.index(valid, True).as_py()
    return _coordinates(meta, 0 if index is None or index < 0 else index)


def first_misfit(column: pa.ChunkedArray, target: pa.DataType, meta: pa.Table | None) -> str:
    """Where the first value of `column` that cannot be cast to `target` came from (no value shown)."""
    if meta is None:
        return ""
    for index in range(len(column)):
        try:
            column.slice(index, 1).cast(target)
        except _CAST_ERRORS:
            return _coordinates(meta, index)
    return ""


def _fitting(column: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray | None:
    """`column` cast to `target` when every value survives the cast unchanged, else None (a float64
    value cast to float32 may lose digits without an error: it is cast back and compared)."""
    try:
        narrowed = column.cast(target)
    except _CAST_ERRORS:
        return None
    return narrowed if narrowed.cast(column.type).equals(column) else None


class _Batch:
    """One batch being conformed to one table under one policy."""

    def __init__(self, batch: pa.Table, table: str, policy: SchemaChanges, meta: pa.Table | None) -> None:
        self.batch = batch
        self.table = table
        self.policy = policy
        self.meta = meta

    def stop(self, name: str, table_type: pa.DataType, why: str, where: str) -> DeltaSchemaError:
        kind = self.batch.schema.field(name).type
        return DeltaSchemaError(
            f"table {self.table}: column {name!r} has type {kind} in this batch but {table_type} in the table"
            f"{where}; {why} (schema_changes: {self.policy})"
        )

    def cast(self, name: str, target: pa.DataType, why: str) -> pa.ChunkedArray:
        column = self.batch.column(name)
        try:
            return column.cast(target)
        except _CAST_ERRORS:
            raise self.stop(name, target, why, first_misfit(column, target, self.meta)) from None

    def column(self, name: str, table_type: pa.DataType) -> tuple[pa.ChunkedArray, pa.DataType | None]:
        """The batch's column for table column `name`, and the type to widen the table's column to."""
        column = self.batch.column(name)
        kind = column.type
        if plain_type(kind) == plain_type(table_type) or column.null_count == len(column) or pa.types.is_null(kind):
            return column.cast(table_type), None
        if self.policy == "fail":
            raise self.stop(name, table_type, "the source changed the column's type", _first_value(column, self.meta))
        if widens(table_type, kind):
            if self.policy == "ignore":
                return self.cast(name, table_type, "a value does not fit the table's type"), None
            if self.policy == "lenient":
                narrowed = _fitting(column, table_type)
                if narrowed is not None:
                    return narrowed, None
            return column, kind
        if widens(kind, table_type):
            return column.cast(table_type), None
        if self.policy == "evolve":
            raise self.stop(name, table_type, "the table's column cannot change to that type (not a widening)",
                            _first_value(column, self.meta))
        return self.cast(name, table_type, "a value does not fit the table's type"), None


def conform(batch: pa.Table, existing: pa.Schema | None, table: str, policy: SchemaChanges = "lenient",
            meta: pa.Table | None = None) -> Conformed:
    """`batch` in the table's column order and types per `policy` (see the module's text); `existing`:
    the table's schema (None: no table yet, the batch creates it); `meta`: the rows' `Meta` columns."""
    if existing is None:
        return Conformed(batch)
    state = _Batch(batch, table, policy, meta)
    columns, fields, widen = [], [], {}
    for table_field in existing:
        if table_field.name in batch.column_names:
            column, wider = state.column(table_field.name, table_field.type)
            if wider is not None:
                widen[table_field.name] = wider
        else:
            column = pa.chunked_array([pa.nulls(batch.num_rows, table_field.type)], table_field.type)
        columns.append(column)
        fields.append(pa.field(table_field.name, column.type))
    for batch_field in batch.schema:
        if batch_field.name in existing.names:
            continue
        if policy == "ignore":
            continue
        if policy == "fail":
            raise DeltaSchemaError(
                f"table {table}: column {batch_field.name!r} ({batch_field.type}) is new in this batch, not in the "
                f"table (schema_changes: fail){_first_value(batch.column(batch_field.name), meta)}"
            )
        columns.append(batch.column(batch_field.name))
        fields.append(batch_field)
    return Conformed(pa.Table.from_arrays(columns, schema=pa.schema(fields)), widen)
