"""JSON documents (Debezium envelopes, flat rows), with or without the Kafka Connect wrapper.

A document decoder is a callable `decode(value: bytes) -> (document, column_types)`; this module
provides the JSON one (`JsonDocuments`), the Avro one lives elsewhere under the same contract.
The Connect wrapper `{"schema": S, "payload": P}` yields P and the column types read from S;
a bare document has no types; a wrapper with a null payload is a tombstone (document None).
Problems raise `DecodeError` with a reason that never quotes the record: rows may carry
personal data. Values stay exactly as parsed: JSON integers stay integers, however long.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from connectors.delta.connect_types import (
    CONNECT_FIELD,
    CONNECT_FIELDS,
    CONNECT_STRUCT,
    CONNECT_TYPE,
    fields_to_types,
)
from service.kafka_to_delta.formats.connect_wrapper import KnownSchemas
from vocabulary.changes import Envelope
from vocabulary.errors import DecodeError

UNAVAILABLE_VALUE = "__debezium_unavailable_value"
"""Debezium's stand-in for an unchanged value it could not read (e.g. a PostgreSQL TOAST column)."""

COMPACT_SEPARATORS = (",", ":")

DocumentDecoder = Callable[[bytes], tuple[Any, dict[str, str] | None]]
"""`decode(value) -> (document or None for a tombstone, column types or None)`; raises `DecodeError`."""

# Built once: json.dumps with options builds a new encoder on every call.
_CANONICAL_ENCODER = json.JSONEncoder(separators=COMPACT_SEPARATORS, sort_keys=True)
_COMPACT_ENCODER = json.JSONEncoder(separators=COMPACT_SEPARATORS)
_SCHEMA_CACHE_SIZE = 256
# Every digit becomes "0". orjson reads integers from -2**63 to 2**64 - 1 exactly and others as floats: a
# run of 20 digits may be beyond 2**64 - 1, and a minus sign before 19 digits below -2**63. A run of 19
# digits without the sign (Debezium's nanosecond `ts_ns` on every record) is below 2**64 - 1.
_DIGITS_TO_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_UNSIGNED_BEYOND = b"0" * 20
_SIGNED_BEYOND = b"-" + b"0" * 19
MAX_NESTING = 200
"""Deepest nesting of arrays and objects in a document: every later step (key and row encoding
here, JSON parsing on the driver) stays far from Python's recursion limit (1000 frames)."""
_TOO_DEEP = f"nested deeper than {MAX_NESTING} levels"
# A lone surrogate can only come from a \u escape: the UTF-8 decoder refuses encoded ones.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def canonical_json(value: Any) -> str:
    """Compact JSON with sorted object keys; ASCII-only so that any string survives UTF-8."""
    return _CANONICAL_ENCODER.encode(value)


def canonical_key(values: list) -> str:
    """`canonical_json(values)` of a list of key values; faster for integers and plain ASCII text."""
    if len(values) == 1 and type(values[0]) is int:
        return f"[{values[0]}]"
    for value in values:
        kind = type(value)
        if not (kind is int or (kind is str and value.isascii() and value.isprintable())):
            return _CANONICAL_ENCODER.encode(values)
    try:
        return orjson.dumps(values).decode()  # the same text for these values
    except orjson.JSONEncodeError:  # integers beyond 64 bits
        return _CANONICAL_ENCODER.encode(values)


def compact_json(value: Any) -> str:
    """Compact JSON keeping object key order (column order matters); for text parsed again
    as JSON, never compared as text (keys use `canonical_json`)."""
    try:
        return orjson.dumps(value).decode()
    except (orjson.JSONEncodeError, UnicodeDecodeError):  # integers beyond 64 bits, lone surrogates
        return _COMPACT_ENCODER.encode(value)


class UnusableJson(ValueError):
    """JSON the pipeline cannot carry: nested deeper than `MAX_NESTING`, or text that is not
    Unicode (a lone UTF-16 surrogate escape, which no UTF-8 string column can hold)."""


def loads(data: bytes) -> Any:
    """Parse with orjson when that gives exactly what the standard parser would.

    orjson turns integers beyond 64 bits into floats and rejects lone surrogates and NaN;
    a long digit run or any orjson failure falls back to `json`, which is exact. Raises
    `ValueError` (including `UnicodeDecodeError`) for anything that is not JSON, and
    `UnusableJson` for JSON nested too deeply or holding a lone surrogate.
    """
    document = _parse(data)
    if data.count(b"[") + data.count(b"{") > MAX_NESTING and _deeper_than(document, MAX_NESTING):
        raise UnusableJson(_TOO_DEEP)
    return document


def _parse(data: bytes) -> Any:
    shape = data.translate(_DIGITS_TO_ZERO)
    if _UNSIGNED_BEYOND not in shape and _SIGNED_BEYOND not in shape:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    try:
        document = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise UnusableJson(_TOO_DEEP) from None
    if _SURROGATE_ESCAPE.search(data) is not None and _has_lone_surrogate(document):
        raise UnusableJson("a \\u escape is a lone UTF-16 surrogate (the text is not Unicode)")
    return document


def _containers(value: Any) -> list:
    if type(value) is dict:
        return [v for v in value.values() if type(v) in (dict, list)]
    return [v for v in value if type(v) in (dict, list)] if type(value) is list else []


def _deeper_than(document: Any, limit: int) -> bool:
    """True when arrays and objects nest more than `limit` levels (iterative: no recursion)."""
    level, depth = _containers([document]), 0
    while level:
        depth += 1
        if depth > limit:
            return True
        level = [child for value in level for child in _containers(value)]
    return False


def _has_lone_surrogate(document: Any) -> bool:
    pending = [document]
    while pending:
        value = pending.pop()
        if type(value) is str:
            if _SURROGATE.search(value) is not None:
                return True
        elif type(value) is dict:
            pending.extend(value.keys())
            pending.extend(value.values())
        elif type(value) is list:
            pending.extend(value)
    return False


def parse_json(data: bytes, what: str) -> Any:
    """`loads`, with failures as `DecodeError` naming `what` and the position, never the text."""
    try:
        return loads(data)
    except UnicodeDecodeError as exc:
        raise DecodeError(f"{what} is not valid JSON: not UTF-8 ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        reason = f"{exc.msg}: line {exc.lineno} column {exc.colno} (char {exc.pos})"
        raise DecodeError(f"{what} is not valid JSON: {reason}") from None
    except UnusableJson as exc:
        raise DecodeError(f"{what} is not usable JSON: {exc}") from None


def is_wrapper(document: Any) -> bool:
    """True for a Kafka Connect JSON wrapper `{"schema": ..., "payload": ...}`."""
    return (
        type(document) is dict and len(document) == 2
        and Envelope.PAYLOAD in document and Envelope.SCHEMA in document
    )


def unwrap(document: Any) -> tuple[Any, Any]:
    """(payload, schema) of a Kafka Connect JSON document; a bare document has no schema."""
    if is_wrapper(document):
        return document[Envelope.PAYLOAD], document[Envelope.SCHEMA]
    return document, None


@dataclass(frozen=True)
class ConnectLayout:
    """Where the row columns sit in a Connect schema block.

    `images`: struct fields holding row images, first found wins (empty: the top-level struct
    is the row, minus `op`); `passthrough`: path -> output column, typed when the schema has it.
    """

    images: tuple[str, ...] = (Envelope.AFTER, Envelope.BEFORE)
    op: str | None = Envelope.OP
    passthrough: tuple[tuple[str, str], ...] = ()

    def column_types(self, schema: Any) -> dict[str, str]:
        """Column type names of the rows; raises `ValueError` when the schema does not fit."""
        fields = _struct_fields(schema, "envelope schema")
        by_name = {f.get(CONNECT_FIELD): f for f in fields if isinstance(f, dict)}
        if self.images:
            image = next((by_name[n] for n in self.images if _is_struct(by_name.get(n))), None)
            if image is None:
                shown = " or ".join(repr(name) for name in self.images)
                raise ValueError(f"envelope schema has no {shown} struct field")
            types = fields_to_types(image.get(CONNECT_FIELDS))
        else:
            types = fields_to_types([f for f in fields if not isinstance(f, dict) or f.get(CONNECT_FIELD) != self.op])
        for path, column in self.passthrough:
            field = _path_field(by_name, path.split("."))
            if field is not None:
                types[column] = fields_to_types([{**field, CONNECT_FIELD: column}])[column]
        return types


def _is_struct(field: Any) -> bool:
    return isinstance(field, dict) and field.get(CONNECT_TYPE) == CONNECT_STRUCT


def _struct_fields(schema: Any, what: str) -> list:
    if not _is_struct(schema):
        raise ValueError(f"{what} is not a struct")
    fields = schema.get(CONNECT_FIELDS)
    if not isinstance(fields, list):
        raise ValueError(f"{what} has no 'fields' list")
    return fields


def _path_field(by_name: dict, segments: list[str]) -> dict | None:
    field = by_name.get(segments[0])
    for segment in segments[1:]:
        if not _is_struct(field) or not isinstance(field.get(CONNECT_FIELDS), list):
            return None
        named = (f for f in field[CONNECT_FIELDS] if isinstance(f, dict) and f.get(CONNECT_FIELD) == segment)
        field = next(named, None)
    return field if isinstance(field, dict) else None


class JsonDocuments:
    """The JSON document decoder: `decode(value) -> (document, column types)`.

    A topic repeats one schema block record after record: its bytes are recognised
    (`KnownSchemas`) and only the payload is parsed, and its column types are mapped once.
    """

    def __init__(self, layout: ConnectLayout = ConnectLayout()) -> None:
        self.layout = layout
        self._known: KnownSchemas[dict[str, str]] = KnownSchemas(loads)
        self._types_by_schema: dict[bytes, dict[str, str]] = {}

    def __call__(self, value: bytes) -> tuple[Any, dict[str, str] | None]:
        known = self._known.split(value)
        if known is not None:
            return known
        document, schema = unwrap(parse_json(value, "value"))
        if schema is None:
            return document, None
        types = self._column_types(schema)
        self._known.learn(value, schema, types)
        return document, types

    def _column_types(self, schema: Any) -> dict[str, str]:
        fingerprint = _fingerprint(schema)
        cached = self._types_by_schema.get(fingerprint)
        if cached is not None:
            return cached
        try:
            types = self.layout.column_types(schema)
        except ValueError as exc:
            raise DecodeError(f"schema block is not usable: {exc}") from None
        if len(self._types_by_schema) >= _SCHEMA_CACHE_SIZE:
            self._types_by_schema.clear()
        self._types_by_schema[fingerprint] = types
        return types

    def __getstate__(self) -> dict:
        return {"layout": self.layout}  # caches are rebuilt where the decoder runs

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["layout"])


def _fingerprint(schema: Any) -> bytes:
    try:
        return orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # integers beyond 64 bits
        return canonical_json(schema).encode()


def json_key(key: bytes) -> tuple[Any, None]:
    """The JSON key decoder: a Kafka key, with or without the Connect wrapper."""
    document, _ = unwrap(parse_json(key, "Kafka key"))
    return document, None
