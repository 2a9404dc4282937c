"""The tables of a database source as pipelines: the settings each table runs with.

A table in the database's shared query is written with `table_pipeline`'s settings (its name
`<database>.<table>` labels its metrics and maintenance). A table whose override needs state
(`TableOverride.own_query`) becomes a pipeline of its own: `with_table_pipelines` adds one per such
table whose topic exists on the cluster now, so the runner, the compiled plan, the upgrade check
and `status` treat it as any pipeline. Such a table's topic appearing later is picked up at the
next start (the shared query leaves it alone meanwhile).
"""

from __future__ import annotations

from pydantic import ValidationError

from connectors.kafka.cluster import ClusterView

from service.config.databases import DatabaseSettings
from service.config.settings import PipelineSettings, Settings
from vocabulary.errors import ConfigError


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
    )


def own_query_pipelines(database: DatabaseSettings, topics: list[str]) -> list[PipelineSettings]:
    """The pipelines of the database's tables that need state, for the topics that exist now."""
    found = []
    for topic, table in sorted(database.routes(topics).items()):
        if database.override(table).own_query:
            try:
                found.append(table_pipeline(database, table, [topic], ()))
            except ValidationError as error:
                reasons = "; ".join(item["msg"] for item in error.errors())
                raise ConfigError(f"database {database.name}, table {table}: {reasons}") from None
    return found


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
