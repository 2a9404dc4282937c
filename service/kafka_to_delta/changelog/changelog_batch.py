"""Arrow batch of Kafka records (`RAW_SCHEMA`) -> Arrow batch of changelog rows (`CHANGELOG_SCHEMA`).

The stateless FROM_CHANGELOG stage as it runs on the executors (`mapInArrow`). The document
decoder is pluggable: JSON with or without the Connect wrapper by default, or any callable
`decode(value) -> (document, column types)` raising `DecodeError` (Avro, Confluent wire
format). Errors travel as data: a record that cannot be converted yields one row with
`error`, the `handling` policy the driver applies, the `stage`, and the original key, value
and headers for a dead-letter store; good rows leave those null. A record that declares its
column types (schema block, Avro) but whose rows do not fit them is such a record too
(`row_fit`): the sink could not store it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from connectors.kafka.range_reader import ValueChunk
from service.config.from_changelog import FromChangelogSettings
from service.kafka_to_delta.changelog.from_changelog import (
    ChangelogRow,
    FromChangelog,
    KeyDecoder,
    Marker,
    RecordRejected,
)
from service.kafka_to_delta.formats.debezium_json import (
    ConnectLayout,
    DocumentDecoder,
    JsonDocuments,
    compact_json,
    json_key,
)
from service.kafka_to_delta.formats.row_fit import BARE_MISFIT, TypedRows
from service.kafka_to_delta.rows.arrow import CHANGELOG_SCHEMA, COMPUTED_FIELDS
from service.kafka_to_delta.rows.names import Column, KafkaColumn
from service.runtime.collector import collector_paused
from vocabulary.changes import ChangeKind
from vocabulary.errors import DecodeError, SourceCoordinates

ERROR_KEY_MAX_CHARS = 200
_KIND_TEXT = {kind: kind.value for kinds in (ChangeKind, Marker) for kind in kinds}
_US_PER_MS = 1000


def connect_layout(settings: FromChangelogSettings) -> ConnectLayout:
    """Where a Connect schema block of these records holds the row columns."""
    images = tuple(dict.fromkeys(f for f in (settings.after, settings.before) if f is not None))
    passthrough = tuple(settings.passthrough_columns.items())
    return ConnectLayout(images=images, op=settings.op, passthrough=passthrough)


def error_key_text(raw_key: bytes | None) -> str | None:
    """A Kafka key as text for error messages and coordinates, cut short."""
    if raw_key is None:
        return None
    return raw_key.decode("utf-8", errors="replace")[:ERROR_KEY_MAX_CHARS]


def error_coordinates(row: Mapping[str, Any]) -> SourceCoordinates:
    """Where an error row's record is in Kafka (from a `CHANGELOG_SCHEMA` row as a dict)."""
    key = error_key_text(row[Column.RAW_KEY])
    return SourceCoordinates(row[Column.TOPIC], row[Column.PARTITION], row[Column.OFFSET], key)


def _error_row(reason: str, handling: str, stage: str) -> tuple:
    return (0, None, None, None, None, None, None, None, None, None, None, None, reason, handling, stage)


class _Output:
    """Output rows (computed columns) and, per row, the input record they came from."""

    def __init__(self, decode_handling: str, keep_raw: bool = False, range_types: dict[str, str] | None = None) -> None:
        self.decode_handling = decode_handling
        self.keep_raw = keep_raw  # every row keeps its record's bytes (late rows may be dead-lettered)
        self.range_types = range_types  # what records without column types are checked against
        self.rows: list[tuple] = []
        self.source: list[int] = []
        self.error_source: list[int | None] = []
        self._types: dict | None = None
        self._types_text: str | None = None
        self.typed = TypedRows()

    def reject(self, index: int, reason: str, handling: str, stage: str) -> None:
        self.rows.append(_error_row(reason, handling, stage))
        self.source.append(index)
        self.error_source.append(index)

    def extend(self, index: int, rows: list[ChangelogRow], types: dict[str, str] | None) -> None:
        if types is not self._types:
            self._types, self._types_text = types, None if types is None else compact_json(types)
        try:
            out = [self._values(number, row) for number, row in enumerate(rows)]
        except (TypeError, ValueError) as exc:  # a value JSON cannot hold (from a custom decoder)
            reason = f"row holds a value JSON cannot represent ({type(exc).__name__})"
            self.reject(index, reason, self.decode_handling, "decode")
            return
        self.rows.extend(out)
        self.source.extend([index] * len(out))
        self.error_source.extend([None] * len(out))
        if types is not None:
            self.typed.add(index, [row.row for row in rows if row.row is not None], types)
        elif self.range_types is not None:
            self.typed.add(index, [row.row for row in rows if row.row is not None], self.range_types, BARE_MISFIT)

    def reject_misfits(self) -> None:
        """Turn the rows of each record whose values do not fit its column types into one error row."""
        misfits = self.typed.misfits()
        if not misfits:
            return
        rejected = set(misfits)
        kept: tuple[list, list, list] = ([], [], [])
        for row, index, error in zip(self.rows, self.source, self.error_source):
            if index in rejected:
                reason = misfits.pop(index, None)
                if reason is None:
                    continue  # the record's first row became its error row
                row, error = _error_row(reason, self.decode_handling, "decode"), index
            for column, value in zip(kept, (row, index, error)):
                column.append(value)
        self.rows, self.source, self.error_source = kept

    def _values(self, number: int, change: ChangelogRow) -> tuple:
        return (
            number, _KIND_TEXT[change.kind], change.key, change.upsert_key, change.partition_key,
            None if change.row is None else compact_json(change.row), self._types_text,
            compact_json(change.unchanged) if change.unchanged else None,
            None if change.intent is None else change.intent.value,
            change.snapshot, change.sequence, change.event_time, None, None, None,
        )

    def batch(self, records: "_BatchRecords | _ChunkRecords") -> pa.RecordBatch:
        columns: dict[str, Any] = {}
        source = pa.array(self.source, pa.int64())
        names = (KafkaColumn.TOPIC, KafkaColumn.PARTITION, KafkaColumn.OFFSET, Column.TIMESTAMP)
        columns.update(zip(names, records.source(source)))
        transposed = list(zip(*self.rows)) or [()] * len(COMPUTED_FIELDS)
        for field, values in zip(COMPUTED_FIELDS, transposed):
            columns[field.name] = pa.array(values, field.type)
        failed = source if self.keep_raw else pa.array(self.error_source, pa.int64())
        columns.update(zip((Column.RAW_KEY, Column.RAW_VALUE, Column.HEADERS), records.raw(failed)))
        return pa.RecordBatch.from_pydict(columns, schema=CHANGELOG_SCHEMA)


class ChangelogBatchDecoder:
    """Kafka record batch -> changelog batch under one FROM_CHANGELOG configuration.

    `value_decoder` / `key_decoder`: `decode(bytes) -> (document, column types)`; JSON by
    default. `ignore_null_updates`: nulls of updates become unchanged markers (`FromChangelog`).
    Picklable, so it can be shipped to Spark executors.
    """

    def __init__(
        self, settings: FromChangelogSettings, primary_key: tuple[str, ...], upsert_key: tuple[str, ...] | None = None,
        value_decoder: DocumentDecoder | None = None, key_decoder: KeyDecoder = json_key,
        ignore_null_updates: bool = False,
    ) -> None:
        self.settings = settings
        self.stage = FromChangelog(settings, primary_key, upsert_key, key_decoder, ignore_null_updates)
        self.decode_value = value_decoder or JsonDocuments(connect_layout(settings))

    def __call__(self, batch: pa.RecordBatch, range_types: dict[str, str] | None = None) -> pa.RecordBatch:
        """Convert one batch in `RAW_SCHEMA` to one in `CHANGELOG_SCHEMA`, in source order.

        `range_types`: column types that records declaring none must fit as well (the types other
        records of their Kafka range declare); a record that does not is rejected like any misfit."""
        return self._decoded(_BatchRecords(batch), range_types)

    def chunk(self, chunk: ValueChunk, range_types: dict[str, str] | None = None) -> pa.RecordBatch:
        """`self(chunk.records())` for a chunk read with `keep_records`, without building its record batch: the
        keys are read from the kept records, and their headers (most of a Debezium record's fields) only for the
        records whose raw bytes the rows keep (errors, or every row where late rows may be dead-lettered)."""
        return self._decoded(_ChunkRecords(chunk), range_types)

    def _decoded(self, records: "_BatchRecords | _ChunkRecords", range_types: dict[str, str] | None) -> pa.RecordBatch:
        keep_raw = self.settings.order_by is not None and self.settings.late_handling == "dead_letter"
        # The batch's documents and rows hold no cycles. They are dropped before the collector runs again:
        # its first collection would otherwise traverse every one of them.
        with collector_paused():
            out = _Output(self.settings.decode_error_handling, keep_raw, range_types)
            self._convert(records.keys(), records.values(), out)
            out.reject_misfits()
            changelog = out.batch(records)
            del out
        return changelog

    def _convert(self, keys: list[bytes | None], values: list[bytes | None], out: _Output) -> None:
        for index, (key, value) in enumerate(zip(keys, values)):
            types = None
            try:
                if value is None:
                    document = None
                else:
                    document, types = self.decode_value(value)
                rows = self.stage.convert(document, key, types)
            except RecordRejected as exc:
                out.reject(index, exc.reason, exc.handling, exc.stage)
            except DecodeError as exc:
                out.reject(index, exc.reason, self.settings.decode_error_handling, "decode")
            else:
                if rows:
                    out.extend(index, rows, types)


class _BatchRecords:
    """The records of a Kafka record batch (`RAW_SCHEMA`), as `_Output.batch` reads them."""

    def __init__(self, batch: pa.RecordBatch) -> None:
        self.batch = batch

    def keys(self) -> list[bytes | None]:
        return self.batch.column(KafkaColumn.KEY).to_pylist()

    def values(self) -> list[bytes | None]:
        return self.batch.column(KafkaColumn.VALUE).to_pylist()

    def source(self, positions: pa.Array) -> list[pa.Array]:
        """Topic, partition, offset and timestamp (epoch ms) of the records at `positions`."""
        columns = [self.batch.column(name).take(positions)
                   for name in (KafkaColumn.TOPIC, KafkaColumn.PARTITION, KafkaColumn.OFFSET)]
        timestamps = pc.divide(pc.cast(self.batch.column(KafkaColumn.TIMESTAMP), pa.int64()), _US_PER_MS)
        return [*columns, timestamps.take(positions)]

    def raw(self, positions: pa.Array) -> list[pa.Array]:
        """Key, value and headers of the records at `positions` (null positions: null)."""
        return [self.batch.column(name).take(positions)
                for name in (KafkaColumn.KEY, KafkaColumn.VALUE, KafkaColumn.HEADERS)]


class _ChunkRecords:
    """The records of a value chunk read with `keep_records`, as `_Output.batch` reads them."""

    def __init__(self, chunk: ValueChunk) -> None:
        if chunk.messages is None:
            raise ValueError("a chunk read without keep_records holds no keys")
        self.chunk, self.messages = chunk, chunk.messages

    def keys(self) -> list[bytes | None]:
        return [message.key() for message in self.messages]

    def values(self) -> list[bytes | None]:
        return self.chunk.values

    def source(self, positions: pa.Array) -> list[pa.Array]:
        chunk, rows = self.chunk, len(positions)
        if chunk.partitions is None:
            partitions = pa.array([chunk.partition] * rows, pa.int32())
        else:
            partitions = pa.array(chunk.partitions, pa.int32()).take(positions)
        return [pa.array([chunk.topic] * rows, pa.string()), partitions,
                pa.array(chunk.offsets, pa.int64()).take(positions),
                pa.array(chunk.timestamps, pa.int64()).take(positions)]

    def raw(self, positions: pa.Array) -> list[pa.Array]:
        named = pc.unique(positions.drop_null()).sort()
        if not len(named):
            return [pa.nulls(len(positions), CHANGELOG_SCHEMA.field(name).type)
                    for name in (Column.RAW_KEY, Column.RAW_VALUE, Column.HEADERS)]
        records = self.chunk.records(named.to_pylist())
        at = pc.index_in(positions, value_set=named)
        return [records.column(name).take(at) for name in (KafkaColumn.KEY, KafkaColumn.VALUE, KafkaColumn.HEADERS)]


def decode_partition(decoder: ChangelogBatchDecoder, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The `mapInArrow` function: `partial(decode_partition, decoder)`."""
    for batch in batches:
        yield decoder(batch)
