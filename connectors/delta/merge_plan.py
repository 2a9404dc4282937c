"""The MERGE of one micro-batch of net changes, as text every Delta engine understands.

The source batch carries, besides the data columns:
- `_cdc_delete` (boolean): the row is a delete of its key;
- `_cdc_keep__<column>` (boolean, optional, one per column): the source value of `<column>`
  is Debezium's unavailable-value marker (an unchanged TOAST value), so the stored value
  must be kept and the marker never written.

The plan (same for delta-rs and delta-spark, both parse backtick-quoted SQL expressions):

    MERGE INTO t USING s ON t.pk = s.pk [AND ...]
    WHEN MATCHED AND s._cdc_delete THEN DELETE
    WHEN MATCHED AND NOT s._cdc_delete THEN UPDATE SET c = s.c,
         k = CASE WHEN s._cdc_keep__k THEN t.k ELSE s.k END, ...
    WHEN NOT MATCHED AND NOT s._cdc_delete THEN INSERT c = s.c,
         k = CASE WHEN s._cdc_keep__k THEN NULL ELSE s.k END, ...

An insert has no stored value to keep, so a kept column is inserted as NULL. Primary-key
columns can never be kept (the key identifies the row). Columns of the source that the
target lacks are listed in `new_columns` (additive schema evolution); assignments are
explicit, so the control columns never reach the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from vocabulary.errors import TerminalError

DELETE_FLAG = "_cdc_delete"
KEEP_FLAG_PREFIX = "_cdc_keep__"
SOURCE_ALIAS = "s"
TARGET_ALIAS = "t"
ClauseKind = Literal["delete", "update", "insert"]
KeptValue = Literal["target", "null"]


class MergePlanError(TerminalError):
    """The batch's columns cannot form a MERGE (missing key or flag, bad keep flag)."""


def quote(column: str) -> str:
    """A column name as a backtick-quoted SQL identifier (backticks inside are doubled)."""
    return "`" + column.replace("`", "``") + "`"


def keep_flag(column: str) -> str:
    """Name of the source column flagging that `column`'s stored value must be kept."""
    return KEEP_FLAG_PREFIX + column


def _source(column: str) -> str:
    return f"{SOURCE_ALIAS}.{quote(column)}"


def _target(column: str) -> str:
    return f"{TARGET_ALIAS}.{quote(column)}"


@dataclass(frozen=True)
class Assignment:
    """`column` (an unquoted target column name) is set to the SQL `expression`."""

    column: str
    expression: str


@dataclass(frozen=True)
class Clause:
    """One WHEN clause: its kind, its condition and (update, insert) its assignments."""

    kind: ClauseKind
    condition: str
    assignments: tuple[Assignment, ...] = ()

    def mapping(self, quote_columns: bool = True) -> dict[str, str]:
        """Assignments as {target column: expression}, column names quoted unless told not to."""
        return {(quote(a.column) if quote_columns else a.column): a.expression for a in self.assignments}


@dataclass(frozen=True)
class MergePlan:
    """Everything an engine needs to run the MERGE of one batch."""

    predicate: str
    clauses: tuple[Clause, Clause, Clause]
    data_columns: tuple[str, ...]
    keep_columns: tuple[str, ...]
    new_columns: tuple[pa.Field, ...]
    source_alias: str = SOURCE_ALIAS
    target_alias: str = TARGET_ALIAS

    @property
    def delete(self) -> Clause:
        """WHEN MATCHED AND deleted THEN DELETE."""
        return self.clauses[0]

    @property
    def update(self) -> Clause:
        """WHEN MATCHED AND NOT deleted THEN UPDATE SET ..."""
        return self.clauses[1]

    @property
    def insert(self) -> Clause:
        """WHEN NOT MATCHED AND NOT deleted THEN INSERT ..."""
        return self.clauses[2]


def _split_columns(names: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(data columns, kept columns) of the source; rejects flags that name no data column."""
    data = tuple(n for n in names if n != DELETE_FLAG and not n.startswith(KEEP_FLAG_PREFIX))
    kept = tuple(n[len(KEEP_FLAG_PREFIX):] for n in names if n.startswith(KEEP_FLAG_PREFIX))
    orphans = [c for c in kept if c not in data]
    if orphans:
        raise MergePlanError(f"keep flag(s) for column(s) {orphans} that the batch does not have")
    return data, kept


def _validate(names: Sequence[str], data: Sequence[str], kept: Sequence[str], primary_key: Sequence[str]) -> None:
    if DELETE_FLAG not in names:
        raise MergePlanError(f"the batch has no {DELETE_FLAG!r} column")
    if not primary_key:
        raise MergePlanError("a MERGE needs at least one primary key column")
    missing = [c for c in primary_key if c not in data]
    if missing:
        raise MergePlanError(f"primary key column(s) {missing} not in the batch")
    kept_keys = [c for c in primary_key if c in kept]
    if kept_keys:
        raise MergePlanError(f"primary key column(s) {kept_keys} cannot keep a stored value")


def _assignments(data: Sequence[str], kept: Sequence[str], kept_as: KeptValue) -> tuple[Assignment, ...]:
    """`source` for each column; a kept column takes the target's value (update) or NULL (insert)."""
    result = []
    for column in data:
        if column in kept:
            fallback = _target(column) if kept_as == "target" else "NULL"
            expression = f"CASE WHEN {_source(keep_flag(column))} THEN {fallback} ELSE {_source(column)} END"
        else:
            expression = _source(column)
        result.append(Assignment(column, expression))
    return tuple(result)


def plan_merge(source: pa.Schema, primary_key: Sequence[str], target: pa.Schema | None = None) -> MergePlan:
    """The MERGE plan of a batch with schema `source` into a table with schema `target`."""
    names = source.names
    data, kept = _split_columns(names)
    _validate(names, data, kept, primary_key)
    deleted = _source(DELETE_FLAG)
    live = f"NOT {deleted}"
    clauses = (
        Clause("delete", deleted),
        Clause("update", live, _assignments(data, kept, kept_as="target")),
        Clause("insert", live, _assignments(data, kept, kept_as="null")),
    )
    existing = set(target.names) if target is not None else set(data)
    new_columns = tuple(source.field(c) for c in data if c not in existing)
    predicate = " AND ".join(f"{_target(c)} = {_source(c)}" for c in primary_key)
    return MergePlan(predicate, clauses, data, kept, new_columns)


def inserted_rows(changes: pa.Table) -> pa.Table:
    """What a MERGE of `changes` into an empty table inserts, computed in Arrow: the rows not flagged
    for deletion, a kept column as NULL (an insert has no stored value to keep), without the flags."""
    live = changes.filter(pc.invert(pc.fill_null(changes.column(DELETE_FLAG), False)))
    for name in [n for n in live.column_names if n.startswith(KEEP_FLAG_PREFIX)]:
        column = name[len(KEEP_FLAG_PREFIX):]
        index = live.schema.get_field_index(column)
        values = live.column(column)
        kept = pc.fill_null(live.column(name), False)
        live = live.set_column(index, live.schema.field(column), pc.if_else(kept, pa.nulls(len(live), values.type), values))
    flags = [DELETE_FLAG] + [n for n in live.column_names if n.startswith(KEEP_FLAG_PREFIX)]
    return live.drop_columns(flags)
