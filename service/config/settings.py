"""Typed, frozen configuration of the whole service, and how a config file becomes one.

A config file is YAML, read by `service.config.sources` (the only module that reads files and
the environment). Strings may reference environment variables as `${NAME}` (secrets stay out
of the file); a missing variable is an error naming it. Unknown or misspelt keys are rejected
with the file and the key path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidationError, model_validator

from service.config.base import Name, Names, SettingsModel
from service.config.choices import (
    Compaction,
    InputFormat,
    LogFormat,
    OnConflict,
    OnDataLoss,
    SchemaChanges,
    StartingOffsets,
    UpsertMaterialize,
)
from service.config.columns import ColumnSettings
from service.config.databases import DEFAULT_IDLE_TIMEOUT_SECONDS, DatabaseSettings
from service.config.dead_letters import DeadLetterSettings
from service.config.exports import ExportSettings
from service.config.from_changelog import FromChangelogSettings
from service.config.history import DEBEZIUM_SEQUENCE, HistorySettings, shorthand
from service.config.joins import JoinSettings
from service.config.maintenance import MaintenanceSettings
from service.config.op_mapping import Grouping, parse_op_mapping
from service.config.registry import SchemaRegistrySettings, share_registry
from service.config.sources import interpolate, read_config_file
from service.config.table_shape import TableShape
from vocabulary.engines import Engine
from vocabulary.errors import ConfigError

_SECRET_HINTS = ("password", "secret", "token", "jaas", "key.pem", "credentials", "oauthbearer.config")

DEFAULT_MAX_OFFSETS_PER_TRIGGER = 200_000
DEFAULT_READINESS_STALE_TRIGGERS = 30
RETRACT_SOURCE_DELAY_SECONDS = 5.0
NO_ON_CONFLICT = (
    "pipeline {name}: {why}, so two sources can claim one row of table {table!r}; choose what happens "
    "then with `on_conflict`: `error` (stop the pipeline naming the key and both sources: the rows "
    "should never collide), `nothing` (the first live row wins, later claimants are ignored until it "
    "is retracted) or `deduplicate` (keep every live row, show the latest, roll back when it is "
    "retracted; state grows with history, bound it with `state_ttl_seconds`)"
)
RETRACT_UNDER_BATCH = (
    "pipeline {name}: `compaction: batch` with `on_conflict: {on_conflict}` is refused for a retract "
    "source: its op_mapping maps op code {codes} to UPDATE_BEFORE alone, so an update's -U and +U are "
    "separate records that may sit in different partitions and land in different micro-batches; a "
    "micro-batch barrier between them makes `{on_conflict}` judge a half-applied update ({harm}). Remove "
    "`compaction` (the default for this source is `watermark`: the halves of one source transaction share "
    "an event time and are compacted together; set `watermark_delay_seconds` to how far partitions may "
    "lag each other) or keep `compaction: batch` with `on_conflict: deduplicate`"
)
_BARRIER_HARM = {
    "nothing": "the new row can be ignored as a conflict and the old one then retracted, leaving no row "
    "although the source holds one",
    "error": "the run can stop on a conflict that never existed",
}


class KafkaSettings(SettingsModel):
    """Where the brokers are; `options` are passed to librdkafka as they are."""

    bootstrap_servers: str = "127.0.0.1:9092"
    options: dict[str, str] = Field(default_factory=dict)

    def client_config(self) -> dict[str, str]:
        """librdkafka configuration for any client of this cluster."""
        return {**self.options, "bootstrap.servers": self.bootstrap_servers}

    def redacted(self) -> dict[str, str]:
        """The configuration with secret-looking values masked, safe to log."""
        return {k: ("***" if is_secret_key(k) else v) for k, v in self.client_config().items()}


class LakehouseSettings(SettingsModel):
    """Where the Delta tables live and which engine writes them."""

    root: str = "./.cdc-lakehouse/tables"
    engine: Engine = "delta-rs"
    storage_options: dict[str, str] = Field(default_factory=dict)

    def table_uri(self, table: str) -> str:
        """URI of one table under the root."""
        return f"{self.root.rstrip('/')}/{table}"


class SparkSettings(SettingsModel):
    """The Spark session: local mode unless `master` says otherwise."""

    master: str = "local[*]"
    app_name: str = "cdc-lakehouse"
    shuffle_partitions: int | None = Field(default=None, ge=1)
    conf: dict[str, str] = Field(default_factory=dict)


class RecoverySettings(SettingsModel):
    """Restarts of a pipeline after a transient failure (broker away, commit conflict).

    The checkpoint and the idempotent Delta commits make a restart safe; terminal errors
    (bad input, bad config, data loss) are never retried.
    """

    max_attempts: int = Field(default=5, ge=0)
    initial_backoff_seconds: float = Field(default=1.0, ge=0)
    max_backoff_seconds: float = Field(default=60.0, ge=0)

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before restart number `attempt` (1-based): doubling, capped."""
        doublings = min(attempt - 1, 64)  # an unbounded power overflows a float after 1024 attempts
        return min(self.max_backoff_seconds, self.initial_backoff_seconds * 2 ** doublings)


class PipelineSettings(SettingsModel):
    """One ingest pipeline: topics of one format into one Delta table."""

    name: Name
    topics: Names = Field(min_length=1)
    format: InputFormat = "json"
    schema_registry: SchemaRegistrySettings | None = None
    from_changelog: FromChangelogSettings = Field(default_factory=lambda: FromChangelogSettings(preset="debezium"))
    dead_letters: DeadLetterSettings | None = None
    table: Name
    primary_key: Names = Field(min_length=1)
    starting_offsets: StartingOffsets | dict[str, dict[str, int]] = "earliest"
    # Bounds each micro-batch (and the driver memory its net changes need); null = no bound.
    max_offsets_per_trigger: int | None = Field(default=DEFAULT_MAX_OFFSETS_PER_TRIGGER, ge=1)
    # Keyed-state materializer (spec: sink upsert materializer, ON CONFLICT).
    upsert_key: Names | None = None
    upsert_materialize: UpsertMaterialize = "auto"
    on_conflict: OnConflict | None = None
    compaction: Compaction | None = None  # unset: see `effective_compaction`
    watermark_delay_seconds: float | None = Field(default=None, ge=0)  # unset: see `effective_watermark_delay_seconds`
    # Per-partition watermark: a partition with no unread data for this long stops holding the
    # event-time watermark back (0: as soon as it is caught up; null: never).
    idle_timeout_seconds: float | None = Field(default=DEFAULT_IDLE_TIMEOUT_SECONDS, ge=0)
    # Offsets deleted before they were read: fail (DataLoss) or resume at the earliest offset left.
    on_data_loss: OnDataLoss = "fail"
    # Schema changes of the source (new columns, other types): evolve | lenient | ignore | fail.
    schema_changes: SchemaChanges = "lenient"
    sequence_by: Names = ()
    tombstone_retention_seconds: float = Field(default=86_400.0, ge=0)
    state_ttl_seconds: float = Field(default=0.0, ge=0)
    materializer_state_ttl_seconds: float | None = Field(default=None, ge=0)
    # Maintenance of this pipeline's table; unset: the top-level `maintenance` block.
    maintenance: MaintenanceSettings | None = None
    # An SCD type 2 history table next to the current-row table (service/config/history.py).
    history: Annotated[HistorySettings | None, BeforeValidator(shorthand)] = None
    # Soft deletes, ignore_null_updates, partitioning and clustering (service/config/table_shape.py).
    table_shape: TableShape = Field(default_factory=TableShape)
    # Column selection, computed columns, row filter and masking (service/config/columns.py).
    columns: ColumnSettings | None = None

    @property
    def changelog_settings(self) -> FromChangelogSettings:
        """FROM_CHANGELOG settings with the pipeline's `sequence_by` (the values the materializer orders by),
        else the history's (the versions' validity)."""
        sequence_by = self.sequence_by or self.history_sequence_by
        if not sequence_by:
            return self.from_changelog
        return self.from_changelog.model_copy(update={"sequence_by": sequence_by})

    @property
    def history_sequence_by(self) -> tuple[str, ...]:
        """The value a history version's validity is taken from: configured, else the source log position
        for the Debezium presets; empty without a history."""
        if self.history is None:
            return ()
        if self.history.sequence_by:
            return self.history.sequence_by
        preset = self.from_changelog.preset
        return DEBEZIUM_SEQUENCE if preset is not None and preset.startswith("debezium") else ()

    @property
    def effective_upsert_key(self) -> tuple[str, ...]:
        """The upsert key of the input: as configured, else the primary key; empty = whole row."""
        return self.primary_key if self.upsert_key is None else self.upsert_key

    def _materializer_reason(self) -> str | None:
        if self.effective_upsert_key != self.primary_key:
            shown = ", ".join(self.effective_upsert_key) or "(none: the whole row)"
            return f"the upsert key ({shown}) differs from the primary key ({', '.join(self.primary_key)})"
        if len(self.topics) > 1:
            return f"{len(self.topics)} topics feed one table"
        return None

    @property
    def one_live_row_per_key(self) -> bool:
        """Whether a primary key holds one live row at most (one topic, whose upsert key is the primary key):
        the materializer then keeps digests of rows, not their text (`materialize.row_digest`)."""
        return self._materializer_reason() is None

    @property
    def materialized(self) -> bool:
        """Whether the keyed-state materializer runs (`auto`: keys differ or several inputs)."""
        if self.upsert_materialize != "auto":
            return self.upsert_materialize == "force"
        return self._materializer_reason() is not None or bool(self.sequence_by)

    @property
    def update_before_codes(self) -> tuple[str, ...]:
        """Op codes of FROM_CHANGELOG that stand for UPDATE_BEFORE alone (see `retract_source`)."""
        groupings = parse_op_mapping(self.from_changelog.op_mapping)
        return tuple(code for code, grouping in groupings.items() if grouping is Grouping.UPDATE_BEFORE)

    @property
    def retract_source(self) -> bool:
        """Whether an update's -U can arrive as a record apart from its +U (spec: retract sources).

        True when an op code maps to UPDATE_BEFORE alone (the `flat` preset, the spec's default
        mapping): its +U is another record, possibly in another partition and micro-batch. False
        when every -U comes with its +U from one record: 'UPDATE_BEFORE, UPDATE_AFTER' (Debezium
        'u') or 'INSERT, UPDATE_BEFORE, UPDATE_AFTER' (the -U is the stored previous image).
        """
        return bool(self.update_before_codes)

    @property
    def effective_compaction(self) -> Compaction:
        """`compaction` as configured; unset: `watermark` when the materializer runs on a retract
        source (a micro-batch barrier could fall between -U and +U), else `batch`."""
        if self.compaction is not None:
            return self.compaction
        return "watermark" if self.materialized and self.retract_source else "batch"

    @property
    def effective_watermark_delay_seconds(self) -> float:
        """`watermark_delay_seconds` as configured; unset: `RETRACT_SOURCE_DELAY_SECONDS` where the
        materializer compacts a retract source on the watermark (a +U read before its -U was written
        must not be compacted alone; a caught-up partition does not hold the watermark back), else 0."""
        if self.watermark_delay_seconds is not None:
            return self.watermark_delay_seconds
        if self.materialized and self.retract_source and self.effective_compaction == "watermark":
            return RETRACT_SOURCE_DELAY_SECONDS
        return 0.0

    @property
    def materializer_ttl_seconds(self) -> float:
        """The materializer's state TTL: its own setting, else the pipeline's (0 = forever)."""
        own = self.materializer_state_ttl_seconds
        return self.state_ttl_seconds if own is None else own

    @model_validator(mode="after")
    def _conflict_choice(self) -> "PipelineSettings":
        reason = self._materializer_reason()
        if self.upsert_materialize != "none" and reason and self.on_conflict is None:
            raise ValueError(NO_ON_CONFLICT.format(name=self.name, why=reason, table=self.table))
        if self.format == "avro-confluent" and self.schema_registry is None:
            raise ValueError("format avro-confluent needs `schema_registry: {url: ...}`")
        if self.from_changelog.invalid_op_handling == "DEAD_LETTER" or self.from_changelog.decode_error_handling == (
            "DEAD_LETTER"
        ) or self.from_changelog.late_handling == "dead_letter":
            if self.dead_letters is None:
                raise ValueError("a DEAD_LETTER policy needs `dead_letters: {topic: ..., table: ...}`")
        if self.from_changelog.truncate_handling == "truncate" and self.materialized:
            raise ValueError(
                "truncate_handling: truncate cannot be combined with the materializer (its state is per key)"
            )
        if self.compaction == "watermark" and not self.materialized:
            raise ValueError("compaction: watermark needs the materializer (upsert_materialize: force or auto)")
        self._check_retract_source_barrier()
        self._check_history()
        self._check_columns()
        self.table_shape.check(f"pipeline {self.name}: table_shape", None,
                               self.from_changelog.truncate_handling == "truncate")
        return self

    def _check_columns(self) -> None:
        if self.columns is None:
            return
        where = f"pipeline {self.name}: columns"
        self.columns.check(where, self.primary_key)
        given = [name for name, on in (("computed", bool(self.columns.computed)),
                                       ("filter", self.columns.filter is not None)) if on]
        if self.history is not None and given:
            raise ValueError(f"{where}: {' and '.join(given)} cannot be combined with history (the history is cut "
                             "from every change as decoded; include, exclude and mask apply to it as to the table)")

    def _check_history(self) -> None:
        if self.history is None:
            return
        where = f"pipeline {self.name}: history"
        if self.materialized:
            raise ValueError(f"{where} is built from every change of a micro-batch, which the keyed-state "
                             "materializer does not hand on; use one topic, the primary key as upsert key and "
                             "no pipeline sequence_by (history.sequence_by orders the versions)")
        if not self.history_sequence_by:
            raise ValueError(f"{where} needs `history.sequence_by` (the value versions are valid from) "
                             "for a source other than the Debezium presets")
        if self.from_changelog.truncate_handling == "truncate":
            raise ValueError(f"{where} cannot be combined with truncate_handling: truncate")
        if self.history.table_for(self.table) == self.table:
            raise ValueError(f"{where}: the history table must differ from the pipeline's table {self.table!r}")

    def _check_retract_source_barrier(self) -> None:
        # Spec (on-conflict): DO ERROR / DO NOTHING assume no barrier between -U and +U, which a
        # retract source cannot promise; the micro-batch is such a barrier, the watermark is not.
        if self.on_conflict not in ("error", "nothing") or self.effective_compaction != "batch":
            return
        if self.materialized and self.retract_source:
            codes = ", ".join(repr(code) for code in self.update_before_codes)
            raise ValueError(RETRACT_UNDER_BATCH.format(
                name=self.name, on_conflict=self.on_conflict, codes=codes, harm=_BARRIER_HARM[self.on_conflict]
            ))


# A database table whose override needs state or a shape (`TableOverride.own_query`) runs as the pipeline
# `<database>.<table>` (`table_pipeline`). Its topic is known only from the cluster, but every setting of
# that pipeline is known from the configuration: `check_tables` builds each such table's pipeline with a
# stand-in topic when the configuration is read, so a bad setting (a history with a materializer, a
# partition column that is a soft delete's own column, clustering on delta-rs) is refused before anything
# starts, naming the database, the table and the option.

STAND_IN_TOPIC = "<topic of {table}>"
"""The topic of a declared table pipeline whose topic is not looked up (validation, `validate`)."""


def table_pipeline(database: DatabaseSettings, table: str, topics: list[str] | tuple[str, ...],
                   primary_key: tuple[str, ...]) -> PipelineSettings:
    """One table of a database as the pipeline it stands for (its name: `<database>.<table>`)."""
    override = database.override(table)
    return PipelineSettings(
        name=f"{database.name}.{table}", topics=tuple(topics), table=table,
        primary_key=tuple(override.primary_key or primary_key),
        format=database.format, schema_registry=database.schema_registry,
        from_changelog=override.from_changelog or database.from_changelog, dead_letters=database.dead_letters,
        starting_offsets=database.starting_offsets, max_offsets_per_trigger=database.max_offsets_per_trigger,
        on_data_loss=database.on_data_loss, schema_changes=database.schema_changes, maintenance=override.maintenance,
        upsert_key=override.upsert_key, upsert_materialize=override.upsert_materialize,
        on_conflict=override.on_conflict, compaction=override.compaction, sequence_by=override.sequence_by,
        watermark_delay_seconds=override.watermark_delay_seconds,
        idle_timeout_seconds=override.idle_timeout_seconds, state_ttl_seconds=override.state_ttl_seconds,
        materializer_state_ttl_seconds=override.materializer_state_ttl_seconds,
        tombstone_retention_seconds=override.tombstone_retention_seconds,
        history=override.history, table_shape=override.table_shape, columns=override.columns,
    )


def table_where(database: str, table: str) -> str:
    """How errors name one table of a database."""
    return f"database {database}, table {table}"


def named_for_table(message: str, database: str, table: str) -> str:
    """A pipeline's error `message` about the table pipeline of `database`.`table`, naming the database and
    the table instead of the pipeline."""
    message = message.removeprefix("Value error, ")
    where = table_where(database, table)
    pipeline = f"pipeline {database}.{table}"
    if message.startswith(pipeline):
        return where + message[len(pipeline):]
    return f"{where}: {message.replace(pipeline + ': ', '')}"


def built_table_pipeline(database: DatabaseSettings, table: str, topics: list[str] | tuple[str, ...]) -> PipelineSettings:
    """`table_pipeline` of a table with its own query; `ValueError` naming the database and the table when its
    settings cannot make a valid pipeline."""
    try:
        return table_pipeline(database, table, topics, ())
    except ValidationError as error:
        reasons = "; ".join(named_for_table(item["msg"], database.name, table) for item in error.errors())
        raise ValueError(reasons) from None


def declared_table_pipelines(database: DatabaseSettings) -> list[PipelineSettings]:
    """The pipelines of the database's tables with their own query, each with a stand-in topic."""
    return [built_table_pipeline(database, table, [STAND_IN_TOPIC.format(table=table)])
            for table, override in sorted(database.tables.items()) if override.own_query]


def check_tables(database: DatabaseSettings, engine: str) -> None:
    """Refuse (`ValueError`) a table override that cannot run as a pipeline on `engine`."""
    for pipeline in declared_table_pipelines(database):
        pipeline.table_shape.check(f"{table_where(database.name, pipeline.table)}: table_shape", engine, False)


class Settings(SettingsModel):
    """The whole service configuration."""

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    lakehouse: LakehouseSettings = Field(default_factory=LakehouseSettings)
    checkpoint_root: str = "./.cdc-lakehouse/checkpoints"
    spark: SparkSettings = Field(default_factory=SparkSettings)
    trigger_interval_seconds: float = Field(default=1.0, ge=0)
    recovery: RecoverySettings = Field(default_factory=RecoverySettings)
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_address: str = "0.0.0.0"
    # /readyz fails once a running trigger is older than this many trigger intervals (plus
    # Spark's idle progress interval); see service/observability/health.py.
    readiness_stale_triggers: int = Field(default=DEFAULT_READINESS_STALE_TRIGGERS, ge=1)
    log_format: LogFormat = "text"  # text | json (one JSON object per line, for log shippers)
    # Key values and row contents in logs and error messages (personal data): off = fingerprints
    # only (vocabulary/redaction.py); topic, partition and offset are always named.
    log_values: bool = False
    # Shared by every pipeline and export without a `schema_registry` block of its own.
    schema_registry: SchemaRegistrySettings | None = None
    # Scheduled compaction, checkpoints and VACUUM of every pipeline's table (service/operations/maintenance.py).
    maintenance: MaintenanceSettings = Field(default_factory=MaintenanceSettings)
    # A micro-batch's Delta commit runs behind the next micro-batch's stages, its changes written ahead into
    # the checkpoint first (service/kafka_to_delta/sink/commits_behind.py; where it applies: `pipeline.py`).
    commits_behind: bool = True
    pipelines: tuple[PipelineSettings, ...] = ()
    # Database sources (service/config/databases.py): every matching topic into its own table, one query.
    databases: tuple[DatabaseSettings, ...] = ()
    exports: tuple[ExportSettings, ...] = ()
    # Join pipelines (service/config/joins.py): `type: inner | left` or `type: enrichment`.
    joins: tuple[Annotated[JoinSettings, Field(discriminator="type")], ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _share_registry(cls, data: Any) -> Any:
        return share_registry(data)

    @model_validator(mode="after")
    def _unique_names(self) -> "Settings":
        # Names key checkpoints, Spark query names and Kafka transactional ids: one namespace.
        names = [p.name for p in self.pipelines] + [j.name for j in self.joins] + [e.name for e in self.exports]
        names += [d.name for d in self.databases]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"pipeline, database, join and export names must be unique; repeated: {', '.join(dupes)}")
        for pipeline in self.pipelines:
            pipeline.table_shape.check(f"pipeline {pipeline.name}: table_shape", self.lakehouse.engine, False)
        for database in self.databases:
            check_tables(database, self.lakehouse.engine)
        return self

    def maintenance_of(self, pipeline: PipelineSettings) -> MaintenanceSettings:
        """The maintenance settings of one pipeline's table: its own block, else the top-level one."""
        return pipeline.maintenance or self.maintenance

    def checkpoint_dir(self, pipeline: str) -> str:
        """Checkpoint location of one pipeline's streaming query."""
        return f"{self.checkpoint_root.rstrip('/')}/{pipeline}"


def is_secret_key(key: str) -> bool:
    """True when a config key names something that must never be logged."""
    lowered = key.lower()
    return any(hint in lowered for hint in _SECRET_HINTS)


def _describe(error: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid configuration"]
    for item in error.errors():
        path = ".".join(str(p) for p in item["loc"]) or "(top level)"
        reason = "unknown key" if item["type"] == "extra_forbidden" else item["msg"]
        lines.append(f"  {path}: {reason}")
    return "\n".join(lines)


def settings_from_mapping(data: dict[str, Any], source: str = "<config>") -> Settings:
    """Validate an already-parsed config mapping."""
    try:
        return Settings.model_validate(interpolate(data or {}, source))
    except ValidationError as error:
        raise ConfigError(_describe(error, source)) from None


def load_settings(path: str | Path) -> Settings:
    """Read and validate a YAML config file; errors name the file and the key."""
    path = Path(path)
    return settings_from_mapping(read_config_file(path) or {}, str(path))
