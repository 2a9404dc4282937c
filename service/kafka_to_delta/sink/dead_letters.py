"""Dead letters: records a pipeline could not use, stored with their original bytes, once.

Each dead letter keeps the record exactly as read (key and value bytes, headers), where it
came from (topic, partition, offset, timestamp), why it failed (stage, error reason), the
pipeline, the batch and when it was stored. Reasons come from the stages and name no
payload; payloads never reach the logs (only counts per stage do).

Stores, either or both (`DeadLetterSettings`, in service/config/dead_letters.py):
- Kafka `topic`: key and value bytes unchanged, original headers first, then metadata
  headers `cdc.dlq.*` (`DlqHeader`); the record timestamp is the time stored. A batch is
  one Kafka transaction (transactional.id per pipeline, which fences an older instance)
  together with a position record (key `dead-letters/<app id>`, value the batch id) in the
  compacted `positions_topic`. The last committed position is read back when the
  producer opens, so a replayed batch is skipped, also after a restart.
- Delta `table` (under the lakehouse root): one row per record (`DEAD_LETTER_SCHEMA`),
  appended with delta-rs in a commit carrying the application transaction (app id, batch
  id); a batch whose id the table already holds for the app id is skipped.

A pipeline with `columns.mask` stores no raw value of a masked column: its dead letters' key and
value are masked where they decode as JSON and dropped where they do not, the error text saying so
(`dead_letter_masks`); its other dead letters keep the record's bytes as read.

The app id defaults to `cdc-lakehouse/<pipeline>/dead-letters`; pass the pipeline's own
application id (it carries the streaming query id) so that batch ids starting again at 0
after a checkpoint reset are not taken for replays.
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import DeltaError, TableNotFoundError

from connectors.kafka.range_reader import RAW_SCHEMA
from connectors.kafka.transactional_producer import (
    KafkaRecord,
    PositionRecord,
    TransactionalProducer,
)
from service.config.dead_letters import DeadLetterSettings
from service.config.sources import mask_salt
from service.kafka_to_delta.sink.dead_letter_masks import DeadLetterMasks
from vocabulary.errors import ConfigError, TerminalError, TransientError

if TYPE_CHECKING:
    from service.config.settings import Settings

log = logging.getLogger(__name__)

TRANSACTIONAL_ID_PREFIX = "cdc-lakehouse-dead-letters-"
HEADERS_TYPE = RAW_SCHEMA.field("headers").type
_TIMESTAMP = pa.timestamp("us", tz="UTC")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

# What `store` reads from its input (other columns are ignored). `timestamp` may also be
# an integer count of milliseconds since the epoch.
INPUT_SCHEMA = pa.schema([
    ("raw_key", pa.binary()), ("raw_value", pa.binary()), ("headers", HEADERS_TYPE),
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()), ("timestamp", _TIMESTAMP),
    ("stage", pa.string()), ("error", pa.string()),
])
DEAD_LETTER_SCHEMA = pa.schema([
    ("pipeline", pa.string()), ("batch_id", pa.int64()), ("stage", pa.string()), ("error", pa.string()),
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()), ("timestamp", _TIMESTAMP),
    ("key", pa.binary()), ("value", pa.binary()), ("headers", HEADERS_TYPE), ("stored_at", _TIMESTAMP),
])


class DlqHeader:
    """Metadata headers added to a dead letter in Kafka (numbers and times as decimal text, ms)."""

    PREFIX = "cdc.dlq."
    TOPIC = PREFIX + "topic"
    PARTITION = PREFIX + "partition"
    OFFSET = PREFIX + "offset"
    TIMESTAMP = PREFIX + "timestamp"
    STAGE = PREFIX + "stage"
    ERROR = PREFIX + "error"
    PIPELINE = PREFIX + "pipeline"
    BATCH = PREFIX + "batch"
    STORED_AT = PREFIX + "stored_at"


class DeadLetterError(TerminalError):
    """Dead letters cannot be stored as configured (bad input columns, unreadable position)."""


class DeadLetterStoreUnavailable(TransientError):
    """The dead-letter table could not be written now; storing the batch again may succeed."""


def _conform(rows: pa.Table) -> pa.Table:
    """The input columns in their canonical types; errors name the column, never a value."""
    missing = [name for name in INPUT_SCHEMA.names if name not in rows.column_names]
    if missing:
        raise DeadLetterError(f"dead-letter rows lack column(s) {missing}")
    columns = []
    for field in INPUT_SCHEMA:
        column = rows.column(field.name)
        if field.name == "timestamp" and pa.types.is_integer(column.type):
            column = column.cast(pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
        try:
            columns.append(column.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise DeadLetterError(
                f"dead-letter column {field.name!r} has type {column.type}, not {field.type}"
            ) from None
    return pa.Table.from_arrays(columns, schema=INPUT_SCHEMA)


def dead_letter_rows(rows: pa.Table, pipeline: str, batch_id: int, stored_at: datetime) -> pa.Table:
    """Conformed input rows as rows of the dead-letter table."""
    n = rows.num_rows
    constant = {
        "pipeline": pa.array([pipeline] * n, pa.string()),
        "batch_id": pa.array([batch_id] * n, pa.int64()),
        "stored_at": pa.array([stored_at] * n, _TIMESTAMP),
        "key": rows.column("raw_key"),
        "value": rows.column("raw_value"),
    }
    columns = [constant[f.name] if f.name in constant else rows.column(f.name) for f in DEAD_LETTER_SCHEMA]
    return pa.Table.from_arrays(columns, schema=DEAD_LETTER_SCHEMA)


def _text(value: object) -> bytes | None:
    return None if value is None else str(value).encode()


def _millis(moment: datetime | None) -> bytes | None:
    """Milliseconds since the epoch as decimal text (exact: integer arithmetic, no float)."""
    return None if moment is None else _text((moment - _EPOCH) // timedelta(milliseconds=1))


def kafka_records(rows: pa.Table, pipeline: str, batch_id: int, stored_at: datetime) -> list[KafkaRecord]:
    """Conformed input rows as Kafka records: original bytes and headers, then `cdc.dlq.*` headers."""
    records = []
    for row in rows.to_pylist():
        headers = [(h["key"], h["value"]) for h in row["headers"] or []]
        metadata = [
            (DlqHeader.TOPIC, _text(row["topic"])),
            (DlqHeader.PARTITION, _text(row["partition"])),
            (DlqHeader.OFFSET, _text(row["offset"])),
            (DlqHeader.TIMESTAMP, _millis(row["timestamp"])),
            (DlqHeader.STAGE, (row["stage"] or "").encode()),
            (DlqHeader.ERROR, (row["error"] or "").encode()),
            (DlqHeader.PIPELINE, pipeline.encode()),
            (DlqHeader.BATCH, str(batch_id).encode()),
            (DlqHeader.STORED_AT, _millis(stored_at)),
        ]
        headers.extend((name, value) for name, value in metadata if value is not None)
        records.append((row["raw_key"], row["raw_value"], headers))
    return records


def _pipeline_masks(settings: "Settings", pipeline: str) -> DeadLetterMasks | None:
    """The masked columns and salt of the ingest pipeline named `pipeline`, None without a mask."""
    found = next((p for p in settings.pipelines if p.name == pipeline), None)
    columns = None if found is None else found.columns
    if columns is None or not columns.mask or columns.salt_env is None:
        return None
    return DeadLetterMasks(tuple(columns.mask), mask_salt(columns.salt_env, f"pipeline {pipeline}: columns"))


class DeadLetterSink:
    """Stores one pipeline's dead letters in its configured topic and/or table, once per batch."""

    def __init__(
        self,
        settings: DeadLetterSettings,
        pipeline: str,
        *,
        kafka_config: dict[str, str] | None = None,
        table_uri: str | None = None,
        storage_options: dict[str, str] | None = None,
        masks: DeadLetterMasks | None = None,
    ) -> None:
        """`masks`: the pipeline's masked columns and salt (keys and values are masked before storing)."""
        if settings.topic is not None and not kafka_config:
            raise ConfigError(f"pipeline {pipeline}: dead_letters.topic needs the Kafka client configuration")
        if settings.table is not None and not table_uri:
            raise ConfigError(f"pipeline {pipeline}: dead_letters.table needs the table's URI")
        self.settings = settings
        self.pipeline = pipeline
        self.kafka_config = dict(kafka_config or {})
        self.table_uri = table_uri if settings.table is not None else None
        self.storage_options = storage_options or None
        self.masks = masks
        self._producer: TransactionalProducer | None = None
        self._kafka_last: dict[str, int | None] = {}

    @classmethod
    def for_pipeline(cls, settings: "Settings", pipeline: str, dead_letters: DeadLetterSettings) -> "DeadLetterSink":
        """The sink of `pipeline`, its table under the lakehouse root, its topic on the service's cluster;
        the pipeline's masked columns (`columns.mask`) masked in every dead letter."""
        table = dead_letters.table
        return cls(
            dead_letters, pipeline,
            kafka_config=settings.kafka.client_config(),
            table_uri=settings.lakehouse.table_uri(table) if table else None,
            storage_options=dict(settings.lakehouse.storage_options),
            masks=_pipeline_masks(settings, pipeline),
        )

    def default_app_id(self) -> str:
        """The application id used when `store` is given none."""
        return f"cdc-lakehouse/{self.pipeline}/dead-letters"

    def store(self, rows: pa.Table, batch_id: int, app_id: str | None = None) -> int:
        """Store the error rows of batch `batch_id`; returns how many dead letters this call stored.

        Returns 0 for an empty batch and for a replay that every configured store already holds.
        """
        letters = _conform(rows)
        if letters.num_rows == 0:
            return 0
        if self.masks is not None:
            letters = self.masks.applied(letters)
        app_id = app_id or self.default_app_id()
        stored_at = datetime.now(timezone.utc)
        stored = False
        if self.table_uri is not None:
            stored |= self._store_delta(letters, batch_id, app_id, stored_at)
        if self.settings.topic is not None:
            stored |= self._store_kafka(letters, batch_id, app_id, stored_at)
        stages = Counter(letters.column("stage").to_pylist())
        log.info("pipeline %s: batch %d: %s %d dead letter(s) (%s)", self.pipeline, batch_id,
                 "stored" if stored else "already held", letters.num_rows,
                 ", ".join(f"{stage}: {count}" for stage, count in sorted(stages.items(), key=str)))
        return letters.num_rows if stored else 0

    def _delta_last_batch(self, app_id: str) -> int | None:
        try:
            table = DeltaTable(self.table_uri, storage_options=self.storage_options)
        except TableNotFoundError:
            return None
        return table.transaction_version(app_id)

    def _store_delta(self, letters: pa.Table, batch_id: int, app_id: str, stored_at: datetime) -> bool:
        """Append the batch unless the table holds it; the commit carries (app id, batch id)."""
        try:
            last = self._delta_last_batch(app_id)
            if last is not None and last >= batch_id:
                return False
            write_deltalake(
                self.table_uri, dead_letter_rows(letters, self.pipeline, batch_id, stored_at), mode="append",
                storage_options=self.storage_options,
                commit_properties=CommitProperties(app_transactions=[Transaction(app_id, int(batch_id))]),
            )
        except DeltaError as error:
            raise DeadLetterStoreUnavailable(
                f"pipeline {self.pipeline}: cannot append dead letters to {self.table_uri}: {type(error).__name__}"
            ) from None
        return True

    def _open_producer(self) -> TransactionalProducer:
        if self._producer is None:
            producer = TransactionalProducer(
                self.kafka_config, TRANSACTIONAL_ID_PREFIX + self.pipeline,
                self.settings.topic, self.settings.positions_topic,
            )
            producer.open()  # fences an older instance and aborts its open transaction first
            self._producer, self._kafka_last = producer, {}
        return self._producer

    def _kafka_last_batch(self, producer: TransactionalProducer, app_id: str) -> int | None:
        if app_id not in self._kafka_last:
            key = f"dead-letters/{app_id}"
            value = producer.last_committed_position(key)
            try:
                self._kafka_last[app_id] = None if value is None else int(value.decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                where = f"topic={self.settings.positions_topic} key={key}"
                raise DeadLetterError(f"{where}: the stored dead-letter position is not a batch id") from None
        return self._kafka_last[app_id]

    def _store_kafka(self, letters: pa.Table, batch_id: int, app_id: str, stored_at: datetime) -> bool:
        """Publish the batch and its position in one transaction unless the position shows it stored."""
        producer = self._open_producer()
        try:
            last = self._kafka_last_batch(producer, app_id)
            if last is not None and last >= batch_id:
                return False
            position = PositionRecord(f"dead-letters/{app_id}", str(int(batch_id)).encode("ascii"))
            producer.send_batch(kafka_records(letters, self.pipeline, batch_id, stored_at), position)
        except BaseException:
            # The outcome of a failed commit is only known by reading the position again.
            self.close()
            raise
        self._kafka_last[app_id] = batch_id
        return True

    def close(self) -> None:
        """Release the Kafka producer (a later `store` opens a new one)."""
        producer, self._producer, self._kafka_last = self._producer, None, {}
        if producer is not None:
            producer.close()
