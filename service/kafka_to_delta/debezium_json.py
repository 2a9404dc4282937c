"""Debezium JSON envelopes -> changes keyed by the sink primary key.

Accepts the Kafka Connect JSON wrapper (`{"schema": ..., "payload": ...}`) or a bare payload.
Tombstones (null value, or a wrapper with a null payload) and logical messages (`op` "m")
decode to nothing. Every other problem is a `DecodeError` whose reason never quotes the
record: rows may carry personal data. `decode_batch` turns errors into data (an `error`
column) so that one bad record never fails a batch.

Values are left exactly as parsed: JSON ints stay ints, and the
`__debezium_unavailable_value` placeholder (`UNAVAILABLE_VALUE`) is not interpreted here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa

from connectors.delta.connect_types import CONNECT_FIELDS, fields_to_types, row_image_schema
from service.changes import DEBEZIUM_NET_KIND, ChangeKind, DebeziumOp, Envelope
from service.errors import DecodeError
from service.kafka_to_delta.connect_wrapper import KnownSchemas

UNAVAILABLE_VALUE = "__debezium_unavailable_value"
"""Debezium's stand-in for an unchanged value it could not read (e.g. a PostgreSQL TOAST column)."""

COMPACT_SEPARATORS = (",", ":")
ERROR_KEY_MAX_CHARS = 200
MAX_OP_CHARS = 20
IGNORED_OPS = frozenset({DebeziumOp.MESSAGE})
WRAPPER_KEYS = frozenset({Envelope.SCHEMA, Envelope.PAYLOAD})
TRUNCATE_UNSUPPORTED = (
    f"truncate events are not supported yet (op {DebeziumOp.TRUNCATE.value!r}); "
    "truncate the Delta table by hand or exclude truncates in the connector (skipped.operations)"
)


class KafkaColumn:
    """Columns of the Kafka record batches given to `decode_batch`."""

    KEY = "key"
    VALUE = "value"
    TOPIC = "topic"
    PARTITION = "partition"
    OFFSET = "offset"
    TIMESTAMP = "timestamp"
    HEADERS = "headers"


DECODED_FIELDS = ("kind", "key", "row", "types", "error")

DECODED_SCHEMA = pa.schema(
    [
        pa.field(KafkaColumn.TOPIC, pa.string()),
        pa.field(KafkaColumn.PARTITION, pa.int32()),
        pa.field(KafkaColumn.OFFSET, pa.int64()),
        *(pa.field(name, pa.string()) for name in DECODED_FIELDS),
    ]
)
"""Output of `decode_batch`: one row per change or per record that failed to decode."""


@dataclass(frozen=True)
class DecodedChange:
    """The net effect of one Debezium event on one primary key.

    `key` is the canonical JSON list of the primary-key values, in primary-key order.
    `row` is the after image (c, r, u) or the primary-key columns only (d).
    `column_types` comes from the schema block, `None` without one.
    """

    kind: ChangeKind
    key: str
    row: dict[str, Any] | None
    column_types: dict[str, str] | None


# Built once: json.dumps with options builds a new encoder on every call.
_CANONICAL_ENCODER = json.JSONEncoder(separators=COMPACT_SEPARATORS, sort_keys=True)
_COMPACT_ENCODER = json.JSONEncoder(separators=COMPACT_SEPARATORS)
_SCHEMA_CACHE_SIZE = 256
# Every digit becomes "0"; a run of 19 of them may be an integer beyond 64 bits.
_DIGITS_TO_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_DIGIT_RUN = b"0" * 19
_types_by_schema: dict[str, dict[str, str]] = {}


def canonical_json(value: Any) -> str:
    """Compact JSON with sorted object keys; ASCII-only so that any string survives UTF-8."""
    return _CANONICAL_ENCODER.encode(value)


def compact_json(value: Any) -> str:
    """Compact JSON keeping object key order (column order matters); for text parsed again
    as JSON, never compared as text (keys use `canonical_json`)."""
    try:
        return orjson.dumps(value).decode()
    except (orjson.JSONEncodeError, UnicodeDecodeError):  # integers beyond 64 bits, lone surrogates
        return _COMPACT_ENCODER.encode(value)


def _loads(data: bytes) -> Any:
    """Parse with orjson when that gives exactly what the standard parser would.

    orjson turns integers beyond 64 bits into floats and rejects lone surrogates and NaN;
    a long digit run or any orjson failure falls back to `json`, which is exact. Raises
    `ValueError` (including `UnicodeDecodeError`) for anything that is not JSON.
    """
    if _LONG_DIGIT_RUN not in data.translate(_DIGITS_TO_ZERO):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data.decode("utf-8"))


def _parse_json(data: bytes, what: str) -> Any:
    try:
        return _loads(data)
    except UnicodeDecodeError as exc:
        raise DecodeError(f"{what} is not valid JSON: not UTF-8 ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        reason = f"{exc.msg}: line {exc.lineno} column {exc.colno} (char {exc.pos})"
        raise DecodeError(f"{what} is not valid JSON: {reason}") from None
    except RecursionError:
        raise DecodeError(f"{what} is not valid JSON: nested too deeply") from None


_known_schemas: KnownSchemas[dict[str, str]] = KnownSchemas(_loads)


def _is_wrapper(document: Any) -> bool:
    return isinstance(document, dict) and document.keys() == WRAPPER_KEYS


def _unwrap(document: Any) -> tuple[Any, Any]:
    """(payload, schema) of a Kafka Connect JSON document; a bare document has no schema."""
    if _is_wrapper(document):
        return document[Envelope.PAYLOAD], document[Envelope.SCHEMA]
    return document, None


def _op(envelope: dict) -> DebeziumOp:
    if Envelope.OP not in envelope:
        raise DecodeError(f"envelope has no {Envelope.OP!r} field")
    code = envelope[Envelope.OP]
    if code is None:
        raise DecodeError(f"envelope has a null {Envelope.OP!r} field")
    try:
        return DebeziumOp(code)
    except ValueError:
        raise DecodeError(f"unknown op code {repr(code)[:MAX_OP_CHARS]}") from None


def _column_types(schema: Any) -> dict[str, str] | None:
    """Column types of a schema block; a topic repeats one block, so it is mapped once."""
    if schema is None:
        return None
    try:
        fields = row_image_schema(schema).get(CONNECT_FIELDS)
        fingerprint = _COMPACT_ENCODER.encode(fields)
        cached = _types_by_schema.get(fingerprint)
        if cached is not None:
            return cached
        types = fields_to_types(fields)
    except ValueError as exc:
        raise DecodeError(f"schema block is not usable: {exc}") from None
    if len(_types_by_schema) >= _SCHEMA_CACHE_SIZE:
        _types_by_schema.clear()
    _types_by_schema[fingerprint] = types
    return types


def _key_values(image: dict, primary_key: tuple[str, ...], where: str) -> list[Any]:
    values = [image.get(column) for column in primary_key]
    for column, value in zip(primary_key, values):
        if value is None:
            raise DecodeError(f"primary key column {column!r} is missing or null in {where}")
    return values


def _delete_image(envelope: dict, key: bytes | None) -> tuple[dict, str]:
    """The image to take the primary key of a delete from, and where it came from."""
    before = envelope.get(Envelope.BEFORE)
    if isinstance(before, dict):
        return before, f"the {Envelope.BEFORE!r} image"
    no_key = f"delete event has no {Envelope.BEFORE!r} object and no usable key"
    if key is None:
        raise DecodeError(f"{no_key} (the Kafka key is null)")
    try:
        key_image, _ = _unwrap(_parse_json(key, "Kafka key"))
    except DecodeError as exc:
        raise DecodeError(f"{no_key} ({exc.reason})") from None
    if not isinstance(key_image, dict):
        raise DecodeError(f"{no_key} (the Kafka key is not an object)")
    return key_image, "the Kafka key"


def _change(
    op: DebeziumOp, envelope: dict, key: bytes | None, primary_key: tuple[str, ...]
) -> tuple[list[Any], dict]:
    """(primary-key values, row) of a create, read, update or delete."""
    if op is DebeziumOp.DELETE:
        image, where = _delete_image(envelope, key)
        values = _key_values(image, primary_key, where)
        return values, dict(zip(primary_key, values))
    after = envelope.get(Envelope.AFTER)
    if not isinstance(after, dict):
        raise DecodeError(f"op {op.value!r} event has no {Envelope.AFTER!r} object")
    return _key_values(after, primary_key, f"the {Envelope.AFTER!r} image"), after


def decode_debezium(
    value: bytes | None, key: bytes | None, primary_key: tuple[str, ...]
) -> DecodedChange | None:
    """Decode one Debezium JSON record; `None` for a tombstone or a logical message.

    Raises `DecodeError` (reason only, no record content) for anything else that is not a
    create, read, update or delete with its primary key.
    """
    if value is None:
        return None
    known = _known_schemas.split(value)
    if known is None:
        document = _parse_json(value, "value")
        if _is_wrapper(document) and document[Envelope.PAYLOAD] is None:
            return None  # The Connect wrapper of a null value: a tombstone too.
        envelope, schema = _unwrap(document)
    else:
        envelope, types = known
        if envelope is None:
            return None
    if not isinstance(envelope, dict):
        raise DecodeError(f"envelope is not an object (got {type(envelope).__name__})")
    op = _op(envelope)
    if op in IGNORED_OPS:
        return None
    if op is DebeziumOp.TRUNCATE:
        raise DecodeError(TRUNCATE_UNSUPPORTED)
    values, row = _change(op, envelope, key, primary_key)
    if known is None:
        types = _column_types(schema)
        if types is not None:
            _known_schemas.learn(value, schema, types)
    return DecodedChange(DEBEZIUM_NET_KIND[op], canonical_json(values), row, types)


def _error_key(key: bytes | None) -> str | None:
    if key is None:
        return None
    return key.decode("utf-8", errors="replace")[:ERROR_KEY_MAX_CHARS]


def _decoded_row(
    value: bytes | None, key: bytes | None, primary_key: tuple[str, ...]
) -> tuple[str | None, ...] | None:
    """Values of `DECODED_FIELDS` for one record, `None` when it decodes to nothing."""
    try:
        change = decode_debezium(value, key, primary_key)
    except DecodeError as exc:
        return None, _error_key(key), None, None, exc.reason
    if change is None:
        return None
    row = None if change.row is None else compact_json(change.row)
    types = None if change.column_types is None else compact_json(change.column_types)
    return change.kind.value, change.key, row, types, None


_CARRIED = (KafkaColumn.TOPIC, KafkaColumn.PARTITION, KafkaColumn.OFFSET)
_DECODED_FROM = (KafkaColumn.VALUE, KafkaColumn.KEY)


def decode_batch(batch: pa.RecordBatch, primary_key: tuple[str, ...]) -> pa.RecordBatch:
    """Decode a batch of Kafka records (key, value, topic, partition, offset, ...).

    Returns a batch in `DECODED_SCHEMA`. Tombstones and messages are dropped; a record that
    fails to decode yields a row with `error` set and no kind, row or types.
    """
    column = {name: batch.column(name).to_pylist() for name in _CARRIED + _DECODED_FROM}
    out: dict[str, list[Any]] = {name: [] for name in DECODED_SCHEMA.names}
    for index, (value, key) in enumerate(zip(*(column[name] for name in _DECODED_FROM))):
        decoded = _decoded_row(value, key, primary_key)
        if decoded is None:
            continue
        for name in _CARRIED:
            out[name].append(column[name][index])
        for name, item in zip(DECODED_FIELDS, decoded):
            out[name].append(item)
    return pa.RecordBatch.from_pydict(out, schema=DECODED_SCHEMA)
