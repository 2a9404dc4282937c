"""A database table with its own query as the pipeline it stands for, and its settings checked as one.

A table whose override needs state or a shape (`TableOverride.own_query`) runs as the pipeline
`<database>.<table>` (`table_pipeline`). Its topic is known only from the cluster, but every setting
of that pipeline is known from the configuration: `check_tables` builds each such table's pipeline
with a stand-in topic when the configuration is read, so a bad setting (a history with a
materializer, a partition column that is a soft delete's own column, clustering on delta-rs) is
refused before anything starts, naming the database, the table and the option.
"""

from __future__ import annotations

from pydantic import ValidationError

from service.config.databases import DatabaseSettings
from service.config.settings import PipelineSettings

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
