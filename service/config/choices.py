"""Every closed set of values a setting takes, defined once (the stages import them from here).

Each `Literal` is the whole set a key accepts; the settings models use them as field types and
the stages that act on a setting use the same type, so a new value is added in one place. The
Delta engine names are in `vocabulary.engines` (the adapters in `connectors/` use them too).
"""

from __future__ import annotations

from typing import Literal

# Ingest pipelines and join inputs.
InputFormat = Literal["json", "debezium-json", "avro-confluent"]
StartingOffsets = Literal["earliest", "latest"]
OnDataLoss = Literal["fail", "earliest"]
"""Offsets deleted before they were read: fail (DataLoss) or resume at the earliest offset left."""
SchemaChanges = Literal["evolve", "lenient", "ignore", "fail"]
"""What a source schema change does to the table (`sink.schema_changes`): evolve it (new columns, widened
types; an incompatible type stops the pipeline), lenient (never loses a value: widens once a value needs
it, keeps values of another type where they fit the table's type, else stops), ignore (the table keeps its
schema, new columns are dropped) or fail (any difference stops the pipeline)."""
OnTableError = Literal["stop", "quarantine"]
"""A database source's table whose batch fails for good: stop the service, or set that table aside."""

# FROM_CHANGELOG (spec 4.1.2).
ChangelogPreset = Literal["debezium", "debezium-upsert", "flat", "deletion-flag", "upsert-kafka"]
RecordHandling = Literal["FAIL", "LOG", "SKIP", "DEAD_LETTER"]
"""What happens to a record with an invalid op, or one that cannot be decoded."""
LateHandling = Literal["drop", "dead_letter"]
TruncateHandling = Literal["fail", "truncate", "ignore"]
KafkaKeyUse = Literal["fallback", "columns"]

# The keyed-state materializer (spec: sink-upsert-materializer, on-conflict).
OnConflict = Literal["error", "nothing", "deduplicate"]
UpsertMaterialize = Literal["auto", "none", "force"]
Compaction = Literal["batch", "watermark"]
"""Where the materializer compacts: at each micro-batch barrier, or when the watermark passes."""

# Joins.
JoinType = Literal["inner", "left"]
MissingPolicy = Literal["nulls", "drop", "dead_letter"]
"""An enrichment probe record with no build row: emit with nulls, drop and count, dead-letter."""

# Exports (TO_CHANGELOG, spec 4.2).
ExportFormat = Literal["debezium-json", "flat-json", "deletion-flag-json", "avro-confluent"]
ExportPreset = Literal["debezium", "flat", "deletion-flag"]
ExportCompaction = Literal["per-flush", "none"]
InputChangelog = Literal["retract", "upsert"]

# The service.
LogFormat = Literal["text", "json"]
"""text, or one JSON object per line (for log shippers)."""

# A pipeline's `columns:` (service/config/columns.py).
MaskMethod = Literal["sha256"]
"""How a masked column's values are replaced: the hex SHA-256 of the salt followed by the value."""

# A pipeline's `table_shape:` (service/config/table_shape.py).
DeleteMode = Literal["hard", "soft"]
"""hard: a delete removes the row; soft: the row stays, flagged `__DELETED` with its `__DELETED_AT`."""
