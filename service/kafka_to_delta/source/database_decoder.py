"""The decoders of a database source's tables (imported where ranges are read, not where they are planned)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.config.databases import DatabaseSettings
from service.config.from_changelog import FromChangelogSettings
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder
from service.kafka_to_delta.formats.debezium_json import json_key
from service.kafka_to_delta.source.decode_stage import value_decoder


def table_decoder(database: DatabaseSettings, primary_key: tuple[str, ...],
                  changelog: FromChangelogSettings | None = None) -> ChangelogBatchDecoder:
    """The decoder of one table of the database (its format, FROM_CHANGELOG settings, the table's own
    `changelog` when it has one, and its primary key)."""
    return ChangelogBatchDecoder(changelog or database.from_changelog, primary_key, primary_key,
                                 value_decoder=value_decoder(database.format, database.schema_registry))


def key_decoder(database: DatabaseSettings) -> Callable[[bytes], tuple[Any, Any]]:
    """Kafka key bytes -> (document, types), in the database's format."""
    decoder = value_decoder(database.format, database.schema_registry)
    return json_key if decoder is None else decoder
