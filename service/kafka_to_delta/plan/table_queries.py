"""A database table's upgrade check when it moves between the database's query and a query of its own.

A table with a shape (`history`, `columns`, `table_shape`) runs as the pipeline `<database>.<table>`,
whose own checkpoint and stored plan the pipeline's upgrade check compares (`plan.upgrades`). What
that check cannot see is the move itself, so it is checked here before anything starts:

- a shape given to a table the database's query has already written (its topic is in the query's
  `tables.json`): refused, as an operator added to a started pipeline is. The table was written in
  the default shape (no history, every column unmasked, hard deletes, no partitions); its own query
  would start from the earliest offsets still held and leave earlier rows as they were written.
- a table whose own query has started with a shape (its stored plan holds a history, table shape or
  columns node) and that now has no shape and no state, so would go back to the database's query:
  refused, as an operator removed from a started pipeline is (the history would silently stop, deletes
  turn hard, masked columns come back unmasked).
"""

from __future__ import annotations

import re

from service.config.databases import DatabaseSettings
from service.config.settings import Settings
from service.config.table_shape import TableShape
from service.kafka_to_delta.plan.compiled_plan import Kind
from service.kafka_to_delta.plan.table_routes import stored_routes
from service.kafka_to_delta.plan.upgrades import started_plan_nodes
from service.runtime.checkpoints import local_path
from vocabulary.errors import ConfigError

SHAPE_KINDS = (Kind.HISTORY, Kind.TABLE_SHAPE, Kind.COLUMNS)
_NEW_TABLE = (
    "To proceed: write the table under the new settings to a new Delta table, e.g. a `pipelines:` entry for its "
    "topic with another `table` (starting_offsets earliest while the topic holds every change), the old table "
    "listed in the database's `exclude` once readers have moved; or keep the table's settings as they were"
)


def check_table_queries(settings: Settings) -> None:
    """Refuse a start that moves a started database table into or out of a query of its own with a shape."""
    for database in settings.databases:
        shared = stored_routes(settings.checkpoint_dir(database.name))
        for topic, table in sorted(shared.items()):
            override = database.override(table)
            if database.table_of(topic) == table and override.shaped:
                given = [name for name, on in (("history", override.history is not None),
                                               ("columns", override.columns is not None),
                                               ("table_shape", override.table_shape != TableShape()))
                         if on]
                raise ConfigError(
                    f"database {database.name}, table {table}: {', '.join(given)} given to a table the database's "
                    f"query has already written in the default shape (checkpoint {settings.checkpoint_dir(database.name)}"
                    f"); its own query would leave the rows written before as they are. {_NEW_TABLE}")
        for table in _own_checkpoints(settings, database):
            override = database.override(table)
            if override.own_query or not _included(database, table):
                continue  # the pipeline's own upgrade check compares it; an excluded table keeps what it has
            nodes = started_plan_nodes(settings.checkpoint_dir(f"{database.name}.{table}"))
            removed = sorted(node["id"] for node in nodes if node.get("kind") in SHAPE_KINDS)
            if removed:
                raise ConfigError(_removed(database.name, table, removed))


def _own_checkpoints(settings: Settings, database: DatabaseSettings) -> list[str]:
    """The tables of `database` with a local checkpoint of their own query (`<database>.<table>`)."""
    root = local_path(settings.checkpoint_root)
    if root is None or not root.is_dir():
        return []
    prefix = f"{database.name}."
    pipelines = {p.name for p in settings.pipelines}
    return sorted(path.name[len(prefix):] for path in root.iterdir()
                  if path.is_dir() and path.name.startswith(prefix) and path.name not in pipelines)


def _included(database: DatabaseSettings, table: str) -> bool:
    """Whether the database's include / exclude patterns keep `table`."""
    if database.include and not any(re.fullmatch(p, table) for p in database.include):
        return False
    return not any(re.fullmatch(p, table) for p in database.exclude)


def _removed(database: str, table: str, removed: list[str]) -> str:
    return (f"database {database}, table {table}: its own query has started with {', '.join(removed)}, which the "
            f"configuration no longer gives it; the table would go back to the database's query in the default shape "
            f"over rows written in another. {_NEW_TABLE}")
