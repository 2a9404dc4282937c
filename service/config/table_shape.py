"""A pipeline's table shape besides its columns: how deletes are applied, whether nulls in an update
overwrite, and how the table is laid out.

- `deletes: hard` (default) removes a deleted key's row; `deletes: soft` keeps it, with `__DELETED`
  true and `__DELETED_AT` the delete's time (the Kafka record's timestamp); a later upsert of the key
  clears both. A delete of a key the table lacks stores a deleted row holding the key alone.
- `ignore_null_updates: true`: a null in an update keeps the key's latest value (the decode makes it
  Debezium's unavailable-value marker, filled from the key's earlier images of the batch, else kept
  from the table); an insert stores its nulls (docs/design/table-shape.md).
- `partition_by`: the table's partition columns, set when the table is created (both engines).
- `cluster_by`: liquid clustering columns, set when the table is created (delta-spark only).
- `deletion_vectors: true`: the table is created with Delta's deletion vectors enabled
  (`delta.enableDeletionVectors`): a MERGE marks the rows it changes deleted in their files instead of
  rewriting the files (both engines; delta-rs's through the small commits, connectors/delta/small_commit.py).
  The table then needs readers that know deletion vectors (delta-spark 2.3+, delta-rs's query engine,
  Trino, DuckDB; not deltalake's `to_pyarrow_table`), so it is off unless asked for.

The partition and clustering columns must be columns of the table: validated against the pipeline's
primary key and, once the table exists, its schema; changing any of these on a started pipeline is
refused by the upgrade check (`plan.upgrades`).
"""

from __future__ import annotations

from typing import Any

from pydantic import model_validator

from service.config.base import Names, SettingsModel
from service.config.choices import DeleteMode
from service.config.history import DELETED

DELETED_AT = "__DELETED_AT"
DELETION_VECTORS = "delta.enableDeletionVectors"
SOFT_DELETE_COLUMNS = (DELETED, DELETED_AT)
CLUSTERING_ENGINES = ("delta-spark",)
NO_CLUSTERING_REASON = (
    "the delta-rs engine cannot create a table with liquid clustering (deltalake's Python API has no "
    "clustering option at table creation); use `partition_by`, or `lakehouse.engine: delta-spark`"
)


class TableShape(SettingsModel):
    """How one pipeline's table applies deletes and nulls, and how it is laid out (see the module's text)."""

    deletes: DeleteMode = "hard"
    ignore_null_updates: bool = False
    partition_by: Names = ()
    cluster_by: Names = ()
    deletion_vectors: bool = False

    @model_validator(mode="after")
    def _layout(self) -> "TableShape":
        if self.partition_by and self.cluster_by:
            raise ValueError("give partition_by or cluster_by, not both (Delta refuses clustering a partitioned table)")
        for name, columns in (("partition_by", self.partition_by), ("cluster_by", self.cluster_by)):
            if len(set(columns)) != len(columns):
                raise ValueError(f"{name} names a column twice: {list(columns)}")
            reserved = [c for c in columns if c in SOFT_DELETE_COLUMNS]
            if reserved:
                raise ValueError(f"{name}: {reserved} are the soft deletes' own columns")
        return self

    @property
    def soft_deletes(self) -> bool:
        """Whether a delete keeps the row, flagged."""
        return self.deletes == "soft"

    def check(self, where: str, engine: str | None, truncates: bool) -> None:
        """Refuse what the pipeline's `engine` (None: not known here) or TRUNCATE handling cannot do with this
        shape (`where` names it)."""
        if self.cluster_by and engine is not None and engine not in CLUSTERING_ENGINES:
            raise ValueError(f"{where}: cluster_by {list(self.cluster_by)}: {NO_CLUSTERING_REASON}")
        if self.soft_deletes and truncates:
            raise ValueError(f"{where}: deletes: soft cannot be combined with truncate_handling: truncate (a TRUNCATE "
                             "would remove the rows soft deletes keep); use truncate_handling fail or skip")

    def layout_problem(self, columns: list[str]) -> str | None:
        """Why the partition or clustering columns cannot lay out a table of `columns` (None: they can)."""
        for name, chosen in (("partition_by", self.partition_by), ("cluster_by", self.cluster_by)):
            missing = [c for c in chosen if c not in columns]
            if missing:
                return f"table_shape.{name} column(s) {missing} are not columns of the table ({columns})"
        return None

    def plan_properties(self) -> dict[str, Any]:
        """What the compiled plan records of the shape (the upgrade check compares it; `deletion_vectors`
        only when on, so plans stored before it existed compare equal)."""
        shown: dict[str, Any] = {"deletes": self.deletes, "ignore_null_updates": self.ignore_null_updates,
                                 "partition_by": list(self.partition_by), "cluster_by": list(self.cluster_by)}
        if self.deletion_vectors:
            shown["deletion_vectors"] = True
        return shown

    def table_properties(self) -> dict[str, str]:
        """The Delta table properties the table is created with, besides the change feed's."""
        return {DELETION_VECTORS: "true"} if self.deletion_vectors else {}
