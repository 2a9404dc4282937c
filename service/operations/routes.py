"""What `validate` and `plan` say of a database source: the tables its pattern matches on the cluster now."""

from __future__ import annotations

from connectors.kafka.cluster import ClusterView
from service.config.settings import Settings
from vocabulary.errors import CdcLakehouseError


def matched_tables(settings: Settings) -> list[str]:
    """One line per database, then one per table (`table <- topic`); a cluster that does not answer is
    said, not fatal (the configuration itself is valid)."""
    cluster = ClusterView(settings.kafka.client_config())
    lines = []
    try:
        try:
            topics = cluster.topic_names()
        except CdcLakehouseError as error:
            return [f"database {d.name}: tables unknown, the cluster did not answer ({error})"
                    for d in settings.databases]
        for database in settings.databases:
            try:
                routes = database.routes(topics)
            except ValueError as error:
                lines.append(f"database {database.name}: {error}")
                continue
            lines.append(f"database {database.name}: {len(routes)} table(s) matched now, no state "
                         "(last change per key per micro-batch, one MERGE per table)")
            lines += [f"  {table:<32} <- {topic}" + (f"  (own query: pipeline {database.name}.{table})"
                                                      if database.override(table).own_query else "")
                      for topic, table in sorted(routes.items(), key=lambda r: r[1])]
        return lines
    finally:
        cluster.close()
