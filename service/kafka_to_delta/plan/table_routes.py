"""A database source's upgrade check: the table each topic has been written to stays its table.

The checkpoint keeps the source offsets of every topic, so a topic routed to another table after a
restart (a changed `table_name` or `topic_pattern`) would start that table from the offsets already
read, never from the topic's beginning: a table missing every earlier row. The query records each
topic's table next to its checkpoint (`<checkpoint>/tables.json`); on every start the current
routing is checked against it, and a topic that now names another table is refused before
anything runs. A topic no longer matched (excluded) is fine: its table keeps what it has.
"""

from __future__ import annotations

import json

from service.config.databases import DatabaseSettings
from service.runtime.checkpoints import local_path, write_json
from vocabulary.errors import ConfigError

ROUTES_FILE = "tables.json"


def stored_routes(checkpoint: str) -> dict[str, str]:
    """`{topic: table}` as the query has written them (none for a new or remote checkpoint)."""
    folder = local_path(checkpoint)
    if folder is None or not (folder / ROUTES_FILE).exists():
        return {}
    return json.loads((folder / ROUTES_FILE).read_text(encoding="utf-8"))


def store_routes(checkpoint: str, routes: dict[str, str]) -> None:
    """Record the tables written so far (atomically)."""
    folder = local_path(checkpoint)
    if folder is not None:
        write_json(folder / ROUTES_FILE, routes)


def check_routes(database: DatabaseSettings, checkpoint: str) -> None:
    """Refuse a start whose routing sends a topic already written to another table."""
    moved = [(topic, table, database.table_of(topic)) for topic, table in sorted(stored_routes(checkpoint).items())]
    moved = [(topic, old, new) for topic, old, new in moved if new is not None and new != old]
    if moved:
        shown = "; ".join(f"topic {topic}: table {old} -> {new}" for topic, old, new in moved)
        raise ConfigError(
            f"database {database.name}: the configuration routes topics already written to other tables ({shown}); "
            "the checkpoint's offsets would start the new tables after every change already read. Keep "
            "table_name and topic_pattern as they were, or give the database a new name (a new checkpoint: every "
            "topic is read again from its earliest offset into the new tables)")
