"""The `dead_letters:` block of a pipeline: where records it could not use are stored.

The store itself is `service/kafka_to_delta/sink/dead_letters.py`.
"""

from __future__ import annotations

from pydantic import model_validator

from service.config.base import Name, SettingsModel

DEFAULT_POSITIONS_TOPIC = "cdc-lakehouse.dead-letter-positions"
"""Compacted topic of the last stored batch per app id (Kafka store only)."""


class DeadLetterSettings(SettingsModel):
    """Where a pipeline's dead letters go: a Kafka topic, a Delta table, or both."""

    topic: str | None = None
    table: Name | None = None
    # Compacted topic holding the last stored batch per app id (Kafka store only).
    positions_topic: str = DEFAULT_POSITIONS_TOPIC

    @model_validator(mode="after")
    def _somewhere(self) -> "DeadLetterSettings":
        if self.topic is None and self.table is None:
            raise ValueError("dead_letters needs a `topic`, a `table` or both")
        return self
