"""Avro records <-> JSON-compatible documents, and the Confluent-framed decoder and encoder.

A decoded document looks exactly like the JSON a Debezium JSON converter would have written:
rows travel as JSON text between stages, so every value is in the form
`connectors.delta.arrow_types.rows_to_table` takes for its column type: bytes and decimals as
base64 text (decimals as the unscaled big-endian two's complement), dates as epoch days,
timestamps as epoch numbers in the unit of their type name (UTC instants in microseconds),
times as the raw Avro number, nested values as JSON objects and arrays. Logical types are
therefore never materialised: fastavro reads and writes with a copy of the schema stripped of
them, which is also the fast path. The encoder takes those same forms, or the Python objects
(datetime, date, Decimal, bytes) that arrow's `to_pylist` gives.
"""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass
from typing import Any, Callable

import fastavro

from connectors.schema_registry import avro_values as values
from connectors.schema_registry.avro_types import LOGICAL_TYPE, base_type, record_types, row_image
from connectors.schema_registry.client import RegisteredSchema, SchemaRegistryClient, schema_text
from connectors.schema_registry.errors import (
    AvroBodyError,
    AvroEncodeError,
    AvroSchemaError,
    UnusableSchemaError,
)
from connectors.schema_registry.wire_format import frame, split_frame

Document = dict[str, Any]
ColumnTypes = dict[str, str]
_NESTED_KEYS = ("items", "values", "type")
_BODY_PROBLEMS = (EOFError, ValueError, IndexError, KeyError, TypeError, OverflowError, MemoryError)


def without_logical_types(schema: Any) -> Any:
    """A copy of an Avro schema definition with every `logicalType` annotation removed."""
    if isinstance(schema, list):
        return [without_logical_types(branch) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    stripped = {key: value for key, value in schema.items() if key != LOGICAL_TYPE}
    if isinstance(stripped.get("fields"), list):
        stripped["fields"] = [{**f, "type": without_logical_types(f.get("type"))} for f in stripped["fields"]]
    for key in _NESTED_KEYS:
        if isinstance(stripped.get(key), (dict, list)):
            stripped[key] = without_logical_types(stripped[key])
    return stripped


def _body_problem(exc: BaseException) -> str:
    if isinstance(exc, EOFError):
        return "the body ends before the record does"
    if isinstance(exc, UnicodeDecodeError):
        return "a string is not valid UTF-8"
    return f"unreadable ({type(exc).__name__})"


@dataclass(frozen=True)
class AvroRecordCodec:
    """One Avro record schema, compiled: its column types and its JSON-form reader and writer.

    `column_types` are those of the row image (the `after`/`before` record) for a Debezium
    envelope, else of the record itself. `read` raises `ValueError` (with no record content)
    when the body does not decode; `write` raises `AvroEncodeError` naming the failing field.
    """

    definition: Any
    column_types: ColumnTypes
    is_envelope: bool
    raw_schema: Any
    fix_read: Callable[[Any], Any] | None
    prepare_write: Callable[[Any], Any] | None

    @classmethod
    def compile(cls, definition: Any) -> "AvroRecordCodec":
        """Compile a schema definition; raises `AvroSchemaError` unless it is a usable record."""
        try:
            named: dict[str, Any] = {}
            parsed: Any = fastavro.parse_schema(definition, named)
            if base_type(parsed) != "record" or not isinstance(parsed.get("fields"), list):
                raise AvroSchemaError(f"the schema is a {base_type(parsed)}, not a record")
            image = row_image(parsed, named)
            types = record_types(image if image is not None else parsed, named)
            raw = fastavro.parse_schema(without_logical_types(definition))
            readers, writers = values.reader(parsed, named), values.writer(parsed, named)
        except AvroSchemaError:
            raise
        except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
            raise AvroSchemaError(f"not a usable Avro schema ({type(exc).__name__}: {exc})") from None
        return cls(definition, types, image is not None, raw, readers, writers)

    def read(self, body: bytes | memoryview) -> Document:
        """The JSON-form document of one Avro body (schemaless, no header)."""
        stream = io.BytesIO(body)
        try:
            record: Any = fastavro.schemaless_reader(stream, self.raw_schema, None)
        except _BODY_PROBLEMS as exc:
            raise ValueError(_body_problem(exc)) from None
        trailing = len(body) - stream.tell()
        if trailing:
            raise ValueError(f"{trailing} bytes follow the end of the record")
        return record if self.fix_read is None else self.fix_read(record)

    def write(self, record: Document) -> bytes:
        """The Avro body (schemaless, no header) of a record in JSON form or arrow's Python form."""
        try:
            prepared = record if self.prepare_write is None else self.prepare_write(record)
        except values.FieldValueError as exc:
            raise AvroEncodeError(f"the record does not fit its Avro schema: {exc}") from None
        stream = io.BytesIO()
        try:
            fastavro.schemaless_writer(stream, self.raw_schema, prepared, strict_allow_default=True)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            # fastavro's messages may quote values: keep only the kind of failure.
            raise AvroEncodeError(f"the record does not fit its Avro schema ({type(exc).__name__})") from None
        return stream.getvalue()


class ConfluentAvroDecoder:
    """Decodes Confluent-framed Avro values into (JSON-form document, column types).

    Schemas are fetched from the registry once per id and compiled once per decoder; the
    returned column-type dicts are shared between records and must not be mutated.
    """

    def __init__(self, client: SchemaRegistryClient) -> None:
        self.client = client
        self._codecs: dict[int, AvroRecordCodec] = {}
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple:
        return ConfluentAvroDecoder, (self.client,)

    def codec(self, schema_id: int) -> AvroRecordCodec:
        """The compiled codec of a registered schema id."""
        codec = self._codecs.get(schema_id)
        if codec is None:
            registered: RegisteredSchema = self.client.schema_by_id(schema_id)
            try:
                codec = AvroRecordCodec.compile(registered.definition)
            except AvroSchemaError as exc:
                raise UnusableSchemaError(schema_id, str(exc)) from None
            with self._lock:
                codec = self._codecs.setdefault(schema_id, codec)
        return codec

    def decode(self, value: bytes | None) -> tuple[Document | None, ColumnTypes | None]:
        """(document, column types of the row image); (None, None) for a tombstone.

        Raises `ShortFrameError`, `BadMagicByteError`, `UnknownSchemaIdError`,
        `UnusableSchemaError` or `AvroBodyError` (all `DecodeError`s), or
        `SchemaRegistryUnavailable` (transient) when the registry cannot be reached.
        """
        if value is None:
            return None, None
        schema_id, body = split_frame(value)
        codec = self.codec(schema_id)
        try:
            return codec.read(body), codec.column_types
        except ValueError as exc:
            raise AvroBodyError(schema_id, str(exc)) from None

    __call__ = decode  # a document decoder: `decode(value) -> (document, column types)`


class ConfluentAvroEncoder:
    """Encodes records with one Avro schema as Confluent-framed values under `subject`.

    The schema is registered on the first `encode` (once per client and subject); a record
    may be in JSON form or in arrow's Python form (see the module docstring).
    """

    def __init__(self, client: SchemaRegistryClient, subject: str, schema: Any) -> None:
        self.client, self.subject = client, subject
        self.codec = AvroRecordCodec.compile(schema)
        self.text = schema_text(schema)

    @property
    def schema_id(self) -> int:
        """The registered id of the schema (registers it on first use)."""
        return self.client.register(self.subject, self.text)

    def encode(self, record: Document | None) -> bytes | None:
        """The framed value of `record`; `None` (a tombstone) for `None`.

        Raises `AvroEncodeError` (naming the field, never the value) when the record does not
        fit the schema, and the client's errors when the schema cannot be registered.
        """
        if record is None:
            return None
        body = self.codec.write(record)
        return frame(self.schema_id, body)
