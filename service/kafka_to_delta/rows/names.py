"""Column names and schema strings of the rows that pass between the ingest stages.

Free of Arrow and Spark: the processes that only plan a query (source creation, read planning, the
streaming source runner) name these without loading the decoders.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class KafkaColumn:
    """Columns of the Kafka record batches (`connectors.kafka.range_reader.RAW_SCHEMA`)."""

    KEY = "key"
    VALUE = "value"
    TOPIC = "topic"
    PARTITION = "partition"
    OFFSET = "offset"
    TIMESTAMP = "timestamp"
    HEADERS = "headers"


class Column:
    """Columns of the changelog rows (`rows.arrow.CHANGELOG_SCHEMA`)."""

    TOPIC = "topic"
    PARTITION = "partition"
    OFFSET = "offset"
    CHANGE_INDEX = "change_index"
    TIMESTAMP = "timestamp"
    KIND = "kind"
    KEY = "key"
    UPSERT_KEY = "upsert_key"
    PARTITION_KEY = "partition_key"
    ROW = "row"
    TYPES = "types"
    UNCHANGED = "unchanged"
    INTENT = "intent"
    SNAPSHOT = "snapshot"
    SEQUENCE = "sequence"
    EVENT_TIME = "event_time"
    ERROR = "error"
    HANDLING = "handling"
    STAGE = "stage"
    RAW_KEY = "raw_key"
    RAW_VALUE = "raw_value"
    HEADERS = "headers"


WATERMARK_COLUMN = "_watermark_ms"
"""A decoded row's watermark candidate (`source.event_time_progress`)."""

# The plain path's payload: what a Kafka range sends to the driver (`source.partition_changes`).
PAYLOAD_SPARK_SCHEMA = "part string, payload binary"
PAYLOAD_COLUMN = "payload"
"""The column of `PAYLOAD_SPARK_SCHEMA` holding the Arrow IPC values."""


class Part:
    """Values of the payload's `part` column."""

    CHANGES = "changes"
    FAILED = "failed"


class Meta:
    """Columns of part `changes` besides the row's own (upsert or delete, source position)."""

    KEY = "__cdc_key"
    KIND = "__cdc_kind"
    TOPIC = "__cdc_topic"
    PARTITION = "__cdc_partition"
    OFFSET = "__cdc_offset"
    CHANGE_INDEX = "__cdc_change_index"
    TIMESTAMP = "__cdc_timestamp"
    UNCHANGED = "__cdc_unchanged"

    ORDER = (TOPIC, PARTITION, OFFSET, CHANGE_INDEX)
    SOURCE = {KEY: Column.KEY, TOPIC: Column.TOPIC, PARTITION: Column.PARTITION, OFFSET: Column.OFFSET,
              CHANGE_INDEX: Column.CHANGE_INDEX, TIMESTAMP: Column.TIMESTAMP, UNCHANGED: Column.UNCHANGED}
    ALL = (KEY, KIND, TOPIC, PARTITION, OFFSET, CHANGE_INDEX, TIMESTAMP, UNCHANGED)


FAILED_COLUMNS = (Column.TOPIC, Column.PARTITION, Column.OFFSET, Column.TIMESTAMP, Column.ERROR, Column.HANDLING,
                  Column.STAGE, Column.RAW_KEY, Column.RAW_VALUE, Column.HEADERS)
"""Columns of part `failed`, as the bad-record policies and dead-letter stores read them."""
COUNTERS = ("conflicts", "rollbacks", "stale_dropped", "cleared_state_warnings")
"""The materializer's counters a net row carries."""

# The materializer's input: changelog rows grouped by key, and packed per key bucket.
GROUP = "_group"
"""A change's group key: its primary key, or for a failed row its own (`error_group_key`)."""
EVENT_TIME = "event_time"
_ERROR_KEY_PREFIX = "\u0000error:"


def error_group_key(coordinates: str) -> str:
    """Group key of a failed row: its own, so that it is never merged with another."""
    return _ERROR_KEY_PREFIX + coordinates


BUCKET = "bucket"
PACKED_CHANGES = "changes"
PACKED_SPARK_SCHEMA = f"{BUCKET} bigint, {WATERMARK_COLUMN} bigint, {PACKED_CHANGES} binary"
"""One row per (decoded chunk, key bucket): the bucket, its rows' largest watermark candidate, its rows."""
STAGE_FIELDS = (
    GROUP, Column.KIND, Column.UPSERT_KEY, Column.ROW, Column.TYPES, Column.UNCHANGED, Column.SEQUENCE, EVENT_TIME,
    Column.TOPIC, Column.PARTITION, Column.OFFSET, Column.CHANGE_INDEX, Column.TIMESTAMP, Column.KEY, Column.ERROR,
    Column.HANDLING, Column.STAGE, Column.RAW_KEY, Column.RAW_VALUE, Column.HEADERS,
)
"""What the materializer's stages read of a change (its group key, `_group`, first): the columns of a packed
chunk, and those `materializer_stage` selects from rows."""

TYPED_PREFIX = "__typed:"
"""Prefix of a change's typed image columns (`__typed:<column>`), carried next to its row text from where Avro
is decoded in bulk (`source.changelog_columns`) to the driver's payload (`materialize.payload`), so the net rows
are not typed from their texts again."""
TYPED_IMAGE = "__typed_image"
"""Whether a change's typed image columns hold its image (false or null: type it from its text)."""


def typed_names(names: Iterable[str]) -> list[str]:
    """The typed image columns (and their flag) among `names`."""
    return [name for name in names if name.startswith(TYPED_PREFIX) or name == TYPED_IMAGE]


# Net changes: at most one per key per batch (`rows.spark.NET_SCHEMA`).
CHANGES_COLUMN = "changes"
"""How many changes a net row stands for."""
EARLIER_IMAGES = "earlier_images"
"""The key's row images of the batch from its last complete one on, when the net row lacks columns."""
PACKED_COLUMN = "net"
PACKED_NET_SPARK_SCHEMA = f"{PACKED_COLUMN} binary"
"""What the bucket materializer emits: per bucket call one row holding its `NET_SCHEMA` rows as an
Arrow IPC stream (`pack_net` / `unpack_net`)."""


class Stage(str, Enum):
    """Where a record failed (the `stage` column)."""

    DECODE = "decode"
    FROM_CHANGELOG = "from_changelog"
    LATE = "late"
