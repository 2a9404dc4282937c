"""Record layouts: `OutputRecord`s -> Kafka key bytes, value bytes (None = tombstone), headers.

Layouts
- Debezium envelope (format `debezium-json`; `avro-confluent` with the debezium preset):
  `{before, after, source: {connector, name, table, version, ts_ms}, op, ts_ms, ...passthrough}`;
  `source.version` / `source.ts_ms` are the Delta commit's version and time, the envelope's
  `ts_ms` the time the record was written.
- Record (`flat-json`, `deletion-flag-json`, `avro-confluent` otherwise): the encoder's value as it is.
- Key: the primary-key values as one object, `{"id": 5}` (a Debezium key without its schema wrapper).

JSON is exact (`json_ready`): integers stay integers (int64 and uint64 included); floats are
numbers, NaN and infinities the strings "NaN", "Infinity", "-Infinity"; decimals are strings
with all their scale digits ("12.30"); timestamps with a zone are ISO-8601 UTC with six fraction
digits and `Z` ("2024-05-01T12:00:00.000000Z"), without a zone the same text without `Z`;
dates "YYYY-MM-DD"; times "HH:MM:SS.ffffff"; durations integer microseconds; binary standard
base64; structs objects; lists arrays; map entries [key, value] arrays. Avro values keep their
Python types: a `ValueSerializer` for the Confluent wire format receives the same documents.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable, Mapping
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, NamedTuple, Protocol

import orjson

from service.config.exports import ExportSettings
from service.delta_to_kafka.changelog.to_changelog import OutputRecord
from vocabulary.changes import Envelope
from vocabulary.errors import ConfigError, TerminalError
from vocabulary.redaction import shown

CONNECTOR = "cdc-lakehouse"
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
ONE_MS = timedelta(milliseconds=1)
ONE_US = timedelta(microseconds=1)
UTC_TEXT = "%Y-%m-%dT%H:%M:%S.%fZ"
NAIVE_TEXT = "%Y-%m-%dT%H:%M:%S.%f"
NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}
NAN_TEXT = "NaN"


class SourceField:
    """Fields of the envelope's `source` block."""

    CONNECTOR = "connector"
    NAME = "name"
    TABLE = "table"
    VERSION = "version"
    TS_MS = Envelope.TS_MS


class Header:
    """Kafka headers on every record."""

    TABLE = "cdc-lakehouse.table"
    COMMIT_VERSION = "cdc-lakehouse.commit-version"


class EncodeError(TerminalError):
    """A value has no representation in the output format."""


class KafkaRecord(NamedTuple):
    """One record ready for the producer: a (key, value, headers) tuple as the transactional producer takes it."""

    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes]]


class ValueSerializer(Protocol):
    """Turns one document (a record's key or value, in arrow's Python values) into bytes.

    One instance per topic and role (key or value), as Confluent subjects are; the Schema
    Registry's `ConfluentAvroEncoder` fits as it is.
    """

    def encode(self, document: dict[str, Any]) -> bytes | None:
        """The wire bytes of `document`."""
        ...


def _float(value: float) -> float | str:
    if math.isnan(value):
        return NAN_TEXT
    return NON_FINITE.get(value, value)


def _datetime(value: datetime) -> str:
    if value.tzinfo is None:
        return value.strftime(NAIVE_TEXT)
    return value.astimezone(timezone.utc).strftime(UTC_TEXT)


_SCALARS: tuple[tuple[type, Any], ...] = (
    (bool, lambda v: v),
    (int, lambda v: v),
    (float, _float),
    (str, lambda v: v),
    (Decimal, lambda v: format(v, "f")),
    (datetime, _datetime),  # before date: a datetime is a date
    (date, lambda v: v.isoformat()),
    (time, lambda v: v.strftime("%H:%M:%S.%f")),
    (timedelta, lambda v: v // ONE_US),
    ((bytes, bytearray, memoryview), lambda v: base64.b64encode(bytes(v)).decode("ascii")),
)


_AS_IS = frozenset({str, int, bool})  # the common cases, checked by exact type first


def json_ready(value: Any) -> Any:
    """`value` with every part replaced by its exact JSON form (see the module docstring)."""
    if value is None or type(value) in _AS_IS:
        return value
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    for kinds, convert in _SCALARS:
        if isinstance(value, kinds):
            return convert(value)
    raise TypeError(f"no JSON form for a value of type {type(value).__name__}")


class JsonSerializer:
    """Exact, compact UTF-8 JSON."""

    def encode(self, document: Mapping[str, Any]) -> bytes:
        """The JSON bytes of `document`; raises EncodeError naming the field that cannot be written."""
        ready = {}
        for field, value in document.items():
            try:
                ready[field] = json_ready(value)
            except TypeError as error:
                raise EncodeError(f"field {field!r}: {error}") from None
        try:
            return orjson.dumps(ready)
        except orjson.JSONEncodeError:  # integers beyond 64 bits
            return json.dumps(ready, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def epoch_ms(value: datetime) -> int:
    """Milliseconds since the epoch of a zoned timestamp."""
    return (value - EPOCH) // ONE_MS


def key_document(record: OutputRecord) -> dict[str, Any]:
    """The record's Kafka key: its primary-key values."""
    return dict(record.key)


def value_document(record: OutputRecord, settings: ExportSettings, processed_at_ms: int) -> dict[str, Any] | None:
    """The record's Kafka value in the export's layout; None for a tombstone."""
    if record.value is None or not settings.debezium_envelope:
        return record.value
    value = record.value
    source = {
        SourceField.CONNECTOR: CONNECTOR,
        SourceField.NAME: settings.name,
        SourceField.TABLE: settings.table,
        SourceField.VERSION: record.commit_version,
        SourceField.TS_MS: epoch_ms(record.commit_timestamp),
    }
    envelope = {
        Envelope.BEFORE: value[Envelope.BEFORE],
        Envelope.AFTER: value[Envelope.AFTER],
        Envelope.SOURCE: source,
        Envelope.OP: value[Envelope.OP],
        Envelope.TS_MS: processed_at_ms,
    }
    envelope.update((k, v) for k, v in value.items() if k not in envelope)
    return envelope


class KafkaRecordEncoder:
    """Serialises an export's `OutputRecord`s for its topic.

    JSON formats need no serializers; `avro-confluent` needs both (Confluent wire format).
    """

    def __init__(
        self,
        settings: ExportSettings,
        key_serializer: ValueSerializer | None = None,
        value_serializer: ValueSerializer | None = None,
    ) -> None:
        if settings.format == "avro-confluent" and (key_serializer is None or value_serializer is None):
            raise ConfigError(f"export {settings.name!r}: format avro-confluent needs a key and a value serializer")
        self.settings = settings
        self._key = key_serializer or JsonSerializer()
        self._value = value_serializer or JsonSerializer()
        self._table_header = (Header.TABLE, settings.table.encode("utf-8"))

    def encode(self, records: Iterable[OutputRecord], processed_at_ms: int) -> list[KafkaRecord]:
        """Kafka records in the order given; `processed_at_ms` fills the envelope's `ts_ms`."""
        encoded = []
        for record in records:
            document = value_document(record, self.settings, processed_at_ms)
            try:
                value = None if document is None else self._value.encode(document)
                key = self._key.encode(key_document(record))
            except EncodeError as error:
                raise EncodeError(f"export {self.settings.name!r} commit version {record.commit_version} "
                                  f"key {shown(record.key)}: {error}") from None
            headers = [self._table_header, (Header.COMMIT_VERSION, str(record.commit_version).encode("ascii"))]
            encoded.append(KafkaRecord(key, value, headers))
        return encoded
