"""A database source: every Debezium topic of a database, one Delta table per topic, one query.

```yaml
databases:
  - name: inventory
    topic_pattern: 'dbserver1\\.(?P<schema>[^.]+)\\.(?P<table>[^.]+)'
    table_name: '{schema}_{table}'
```

Each topic the pattern matches (whole name) is one source table; `table_name` names its Delta
table from the pattern's named groups (and `{topic}`). Primary keys come from the Kafka key
(Debezium keys a table's topic by its primary key), so tables need no block of their own;
`tables` overrides what one table needs. `include` / `exclude` are patterns over the table
names. Topics created later that match are picked up within `topic_refresh_seconds`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, field_validator, model_validator

from service.config.base import NAME_PATTERN, Name, Names, SettingsModel
from service.config.choices import (
    Compaction,
    InputFormat,
    OnConflict,
    OnDataLoss,
    OnTableError,
    SchemaChanges,
    StartingOffsets,
    UpsertMaterialize,
)
from service.config.columns import ColumnSettings
from service.config.dead_letters import DeadLetterSettings
from service.config.from_changelog import FromChangelogSettings
from service.config.history import HistorySettings, shorthand
from service.config.maintenance import MaintenanceSettings
from service.config.registry import SchemaRegistrySettings
from service.config.table_shape import TableShape

DEFAULT_TOPIC_REFRESH_SECONDS = 10.0
DEFAULT_IDLE_TIMEOUT_SECONDS = 0.0
DEFAULT_DATABASE_MAX_OFFSETS = 200_000
_INTERNAL_TOPIC = "__"


class TableOverride(SettingsModel):
    """What one table of a database source sets for itself.

    `primary_key`, `maintenance` and a `from_changelog` without state (its own bad-record policies)
    keep the table in the database's query. A table that needs state (the keyed-state materializer:
    `upsert_key`, `sequence_by`, `on_conflict`, `upsert_materialize: force`, `compaction`; a stateful
    FROM_CHANGELOG or ORDER BY) or a table shape other than the default (`history`, `columns`,
    `table_shape`: as a pipeline's) runs as its own query, the pipeline `<database>.<table>`, with every
    guarantee, plan operator and upgrade check of a pipeline; it needs its `primary_key`
    (docs/design/database-source.md, "Tables with state or a shape").
    """

    primary_key: Names | None = None
    maintenance: MaintenanceSettings | None = None
    from_changelog: FromChangelogSettings | None = None
    upsert_key: Names | None = None
    upsert_materialize: UpsertMaterialize = "auto"
    on_conflict: OnConflict | None = None
    compaction: Compaction | None = None
    sequence_by: Names = ()
    watermark_delay_seconds: float | None = Field(default=None, ge=0)
    idle_timeout_seconds: float | None = Field(default=DEFAULT_IDLE_TIMEOUT_SECONDS, ge=0)
    state_ttl_seconds: float = Field(default=0.0, ge=0)
    materializer_state_ttl_seconds: float | None = Field(default=None, ge=0)
    tombstone_retention_seconds: float = Field(default=86_400.0, ge=0)
    # The table shape options of a pipeline (service/config/history.py, columns.py, table_shape.py).
    history: Annotated[HistorySettings | None, BeforeValidator(shorthand)] = None
    table_shape: TableShape = Field(default_factory=TableShape)
    columns: ColumnSettings | None = None

    @property
    def shaped(self) -> bool:
        """Whether the table is written in a shape other than the default (history, columns, table_shape)."""
        return self.history is not None or self.columns is not None or self.table_shape != TableShape()

    @property
    def own_query(self) -> bool:
        """Whether the table needs state or a shape, so runs as its own pipeline."""
        changelog = self.from_changelog
        return (self.shaped or self.upsert_key is not None or self.upsert_materialize == "force" or self.on_conflict is not None
                or self.compaction is not None or bool(self.sequence_by)
                or (changelog is not None and (changelog.stateful or changelog.order_by is not None)))

    @model_validator(mode="after")
    def _keyed(self) -> "TableOverride":
        if self.own_query and not self.primary_key:
            raise ValueError("a table with state (materializer, stateful FROM_CHANGELOG, ORDER BY) or a shape "
                             "(history, columns, table_shape) runs as its own pipeline and needs its `primary_key`")
        return self


class DatabaseSettings(SettingsModel):
    """Every topic of one database (one Debezium connector) into one Delta table each."""

    name: Name
    topic_pattern: str
    table_name: str = "{table}"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    format: InputFormat = "json"
    schema_registry: SchemaRegistrySettings | None = None
    from_changelog: FromChangelogSettings = Field(default_factory=lambda: FromChangelogSettings(preset="debezium"))
    dead_letters: DeadLetterSettings | None = None
    starting_offsets: StartingOffsets = "earliest"
    max_offsets_per_trigger: int | None = Field(default=DEFAULT_DATABASE_MAX_OFFSETS, ge=1)
    on_data_loss: OnDataLoss = "fail"
    # A table's source schema change (as a pipeline's `schema_changes`), for every table of the database.
    schema_changes: SchemaChanges = "lenient"
    # A table whose batch fails for good: stop the service, or quarantine that table alone.
    on_table_error: OnTableError = "stop"
    topic_refresh_seconds: float = Field(default=DEFAULT_TOPIC_REFRESH_SECONDS, gt=0)
    # delta-rs lets go of the GIL for most of a MERGE: 4 at a time beat 2 (docs/design/database-source.md).
    parallel_merges: int = Field(default=4, ge=1)
    tables: dict[str, TableOverride] = Field(default_factory=dict)

    @field_validator("topic_pattern", "include", "exclude")
    @classmethod
    def _compiles(cls, value: Any) -> Any:
        for pattern in (value,) if isinstance(value, str) else value:
            try:
                re.compile(pattern)
            except re.error as error:
                raise ValueError(f"{pattern!r} is not a regular expression: {error}") from None
        return value

    @model_validator(mode="after")
    def _checked(self) -> "DatabaseSettings":
        groups = set(re.compile(self.topic_pattern).groupindex) | {"topic"}
        used = set(re.findall(r"{(\w+)}", self.table_name))
        unknown = sorted(used - groups)
        if unknown:
            raise ValueError(
                f"database {self.name}: table_name {self.table_name!r} uses {', '.join(unknown)}, which "
                f"topic_pattern does not capture (named groups: {', '.join(sorted(groups))})"
            )
        if self.format == "avro-confluent" and self.schema_registry is None:
            raise ValueError("format avro-confluent needs `schema_registry: {url: ...}`")
        return self

    def table_of(self, topic: str) -> str | None:
        """The Delta table a topic feeds, or None when the topic is not one of this database's."""
        if topic.startswith(_INTERNAL_TOPIC):
            return None
        match = re.fullmatch(self.topic_pattern, topic)
        if match is None:
            return None
        values = {k: v for k, v in match.groupdict().items() if v is not None}
        table = self.table_name.format(topic=topic, **values)
        table = re.sub(r"[^A-Za-z0-9_.\-]", "_", table)
        if not re.fullmatch(NAME_PATTERN, table):
            return None
        if self.include and not any(re.fullmatch(p, table) for p in self.include):
            return None
        if any(re.fullmatch(p, table) for p in self.exclude):
            return None
        return table

    def routes(self, topics: list[str]) -> dict[str, str]:
        """`{topic: table}` for the topics that feed a table (two topics naming one table, or a table named
        as another table's history table: an error)."""
        routed = {topic: table for topic in sorted(topics) if (table := self.table_of(topic)) is not None}
        seen: dict[str, str] = {}
        for topic, table in routed.items():
            if table in seen:
                raise ValueError(f"database {self.name}: topics {seen[table]!r} and {topic!r} both name table "
                                 f"{table!r}; make table_name tell them apart or exclude one")
            seen[table] = topic
        for table, topic in seen.items():
            history = self.override(table).history
            written = None if history is None else history.table_for(table)
            if written in seen:
                raise ValueError(f"database {self.name}: table {table!r} (topic {topic!r}) keeps its history in "
                                 f"table {written!r}, which topic {seen[written]!r} also names; give the history "
                                 "another `table` or exclude that topic")
        return routed

    def shared_routes(self, topics: list[str]) -> dict[str, str]:
        """`routes` without the tables that run as their own query."""
        return {topic: table for topic, table in self.routes(topics).items() if not self.override(table).own_query}

    def override(self, table: str) -> TableOverride:
        """The table's own settings (empty when it has none)."""
        return self.tables.get(table, TableOverride())
