"""The tables of a database source as pipelines: the settings each table runs with.

A table in the database's shared query is written with `table_pipeline`'s settings
(`service/config/settings.py`; its name `<database>.<table>` labels its metrics and
maintenance). A table whose override needs state or a shape other than the default
(`TableOverride.own_query`) becomes a pipeline of its own: `with_table_pipelines` adds one per such
table whose topic exists on the cluster now, so the runner, the compiled plan, the upgrade check
and `status` treat it as any pipeline. Such a table's topic appearing later is picked up at the
next start (the shared query leaves it alone meanwhile).
"""

from __future__ import annotations

from connectors.kafka.cluster import ClusterView
from service.config.databases import DatabaseSettings
from service.config.settings import (
    PipelineSettings,
    Settings,
    built_table_pipeline,
    declared_table_pipelines,
    named_for_table,
)
from vocabulary.errors import ConfigError


def own_query_pipelines(database: DatabaseSettings, topics: list[str]) -> list[PipelineSettings]:
    """The pipelines of the database's tables that need state or a shape, for the topics that exist now."""
    found = []
    for topic, table in sorted(database.routes(topics).items()):
        if database.override(table).own_query:
            try:
                found.append(built_table_pipeline(database, table, [topic]))
            except ValueError as error:
                raise ConfigError(str(error)) from None
    return found


def declared(settings: Settings) -> Settings:
    """`settings` with one pipeline per database table with its own query whether its topic exists or not
    (a stand-in topic): what `validate` compiles and summarises without a cluster."""
    present = {p.name for p in settings.pipelines}
    extra = tuple(p for database in settings.databases for p in declared_table_pipelines(database)
                  if p.name not in present)
    return settings.model_copy(update={"pipelines": settings.pipelines + extra}) if extra else settings


def needs_topics(settings: Settings) -> bool:
    """Whether some database table runs as its own query (its topic is then looked up on the cluster)."""
    return any(override.own_query for database in settings.databases for override in database.tables.values())


def with_table_pipelines(settings: Settings, topics: list[str]) -> Settings:
    """`settings` with one pipeline added per database table that runs as its own query."""
    present = {p.name for p in settings.pipelines}  # already added (expanding twice adds nothing)
    extra = tuple(p for database in settings.databases for p in own_query_pipelines(database, topics)
                  if p.name not in present)
    if not extra:
        return settings
    return settings.model_copy(update={"pipelines": settings.pipelines + extra})


def cluster_topics(client_config: dict[str, str]) -> list[str]:
    """The topics of the cluster now."""
    cluster = ClusterView(client_config)
    try:
        return cluster.topic_names()
    finally:
        cluster.close()


def expanded(settings: Settings) -> Settings:
    """`settings` with the database tables that need state as pipelines, looked up on the cluster when
    there are any (the CLI's `plan` and `status`)."""
    if not needs_topics(settings):
        return settings
    return with_table_pipelines(settings, cluster_topics(settings.kafka.client_config()))


def table_pipelines_only(settings: Settings) -> Settings:
    """`declared(settings)` keeping only the database tables' pipelines (what `validate` summarises)."""
    names = {f"{d.name}.{table}" for d in settings.databases for table, o in d.tables.items() if o.own_query}
    found = declared(settings)
    return found.model_copy(update={"pipelines": tuple(p for p in found.pipelines if p.name in names)})


def naming_tables(messages: list[str], settings: Settings) -> list[str]:
    """Messages about a database table's pipeline (`pipeline <database>.<table>: ...`) naming the database
    and the table instead."""
    tables = [(d.name, table) for d in settings.databases for table, o in d.tables.items() if o.own_query]
    named = []
    for message in messages:
        match = next(((db, t) for db, t in tables if message.startswith(f"pipeline {db}.{t}:")), None)
        named.append(message if match is None else named_for_table(message, *match))
    return named
