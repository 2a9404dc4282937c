"""Per-schema value converters between raw Avro values (no logical types) and JSON-form values.

`reader(schema, named)` compiles a function that turns what fastavro reads into the JSON form
(`avro_codec` module docstring); `writer(schema, named)` compiles the reverse, accepting JSON
forms and arrow's Python objects. Both return `None` when values need no conversion, so a
record of plain numbers and strings costs nothing. Readers convert records in place.

Kafka Connect cannot express recursive types; should a schema hold one anyway, the inner
occurrences are read generically (bytes -> base64) and written as given (raw Avro values).
Unions of several non-null types are read generically and written as given too.
"""

from __future__ import annotations

import base64
import json
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any, Callable

from connectors.delta.arrow_types import (
    CONVERTERS,
    DECIMAL_PATTERN,
    EPOCH_DATE,
    TypeName,
    arrow_type,
)
from connectors.schema_registry.avro_types import (
    AVRO_NULL,
    BINARY_TYPES,
    TimeUnit,
    base_type,
    column_type,
    resolve,
    timestamp_unit,
)

Convert = Callable[[Any], Any]
COMPACT_SEPARATORS = (",", ":")
US_PER: dict[TimeUnit, int] = {"ms": 1_000, "us": 1, "ns": 1}
PER_US: dict[TimeUnit, int] = {"ms": 1, "us": 1, "ns": 1_000}
TYPE_UNITS: dict[str, TimeUnit] = {
    TypeName.TIMESTAMP_MS: "ms",
    TypeName.TIMESTAMP_US: "us",
    TypeName.TIMESTAMP_NS: "ns",
    TypeName.TIMESTAMP_US_UTC: "us",
}
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _base64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _jsonable(value: Any) -> Any:
    """Any raw Avro value in JSON form when its branch is unknown (bytes -> base64)."""
    if isinstance(value, bytes):
        return _base64(value)
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_jsonable(item) for item in value]
    return value


def _each(convert: Convert, container: str) -> Convert:
    if container == "array":
        return lambda items: [None if item is None else convert(item) for item in items]
    return lambda entries: {key: None if item is None else convert(item) for key, item in entries.items()}


def _fields(record: dict, compile_one: Callable[[Any], Convert | None]) -> list[tuple[str, Convert]]:
    compiled = ((field["name"], compile_one(field["type"])) for field in record["fields"])
    return [(name, convert) for name, convert in compiled if convert is not None]


def reader(schema: Any, named: dict[str, Any], visiting: frozenset[str] = frozenset()) -> Convert | None:
    """Raw Avro value -> JSON form, or `None` when the raw value already is in JSON form."""
    if isinstance(schema, list):
        branches = [branch for branch in schema if branch != AVRO_NULL]
        if len(branches) == 1:
            return reader(branches[0], named, visiting)
        return _jsonable if any(reader(b, named, visiting) for b in branches) else None
    schema = resolve(schema, named)
    kind = base_type(schema)
    if kind == "record":
        if schema["name"] in visiting:  # a recursive type: convert whatever arrives
            return _jsonable
        inner = visiting | {schema["name"]}
        fields = _fields(schema, lambda field_type: reader(field_type, named, inner))
        return _record_reader(fields) if fields else None
    if kind in ("array", "map"):
        item = reader(schema["items" if kind == "array" else "values"], named, visiting)
        return None if item is None else _each(item, kind)
    if kind in BINARY_TYPES:
        return _base64
    unit = timestamp_unit(schema)
    if unit is not None and unit != "us" and column_type(schema, named) == TypeName.TIMESTAMP_US_UTC:
        to_us, from_us = US_PER[unit], PER_US[unit]
        return lambda number: number * to_us // from_us
    return None


def _record_reader(fields: list[tuple[str, Convert]]) -> Convert:
    def convert(record: dict) -> dict:
        for name, convert_field in fields:
            item = record[name]
            if item is not None:
                record[name] = convert_field(item)
        return record

    return convert


def writer(schema: Any, named: dict[str, Any], visiting: frozenset[str] = frozenset()) -> Convert | None:
    """JSON form or arrow Python object -> raw Avro value, or `None` when no change is needed."""
    if isinstance(schema, list):
        branches = [branch for branch in schema if branch != AVRO_NULL]
        return writer(branches[0], named, visiting) if len(branches) == 1 else None
    schema = resolve(schema, named)
    kind = base_type(schema)
    if kind == "record":
        if schema["name"] in visiting:
            return None
        inner = visiting | {schema["name"]}
        fields = _fields(schema, lambda field_type: writer(field_type, named, inner))
        return _record_writer(fields) if fields else None
    if kind in ("array", "map"):
        item = writer(schema["items" if kind == "array" else "values"], named, visiting)
        return None if item is None else _each(item, kind)
    return _scalar_writer(kind, column_type(schema, named), schema)


def _scalar_writer(kind: str, type_name: str, schema: Any) -> Convert | None:
    if kind == "string":
        return _write_text
    if DECIMAL_PATTERN.match(type_name) and kind in BINARY_TYPES:
        size = schema.get("size") if kind == "fixed" else None
        return _decimal_writer(arrow_type(type_name).scale, arrow_type(type_name).precision, size)
    if kind in BINARY_TYPES:
        return _write_binary
    if type_name == TypeName.DATE32 and kind == "int":
        return _write_date
    if type_name in TYPE_UNITS and kind == "long":
        return _timestamp_writer(type_name, timestamp_unit(schema) or TYPE_UNITS[type_name])
    return None


def _record_writer(fields: list[tuple[str, Convert]]) -> Convert:
    def convert(record: dict) -> dict:
        prepared = dict(record)
        for name, convert_field in fields:
            item = prepared.get(name)
            if item is None:
                continue
            try:
                prepared[name] = convert_field(item)
            except FieldValueError as exc:
                raise FieldValueError((name, *exc.path), exc.problem) from None
            except (TypeError, ValueError, OverflowError, ArithmeticError, AttributeError):
                # No value in the message: rows may carry personal data.
                raise FieldValueError((name,), "a value cannot be converted to its Avro type") from None
        return prepared

    return convert


class FieldValueError(ValueError):
    """A field value that cannot be written; the message names the field path, never the value."""

    def __init__(self, path: tuple[str, ...], problem: str) -> None:
        self.path, self.problem = path, problem
        super().__init__(f"field {'.'.join(path)!r}: {problem}")


def _write_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return json.dumps(value, separators=COMPACT_SEPARATORS)


def _write_binary(value: Any) -> bytes:
    return CONVERTERS[TypeName.BINARY](value)


def _write_date(value: Any) -> int:
    if isinstance(value, datetime):
        value = value.date()
    if isinstance(value, date):
        return (value - EPOCH_DATE).days
    return CONVERTERS[TypeName.DATE32](value)


def _epoch_us(value: datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _timestamp_writer(type_name: str, unit: TimeUnit) -> Convert:
    to_us = CONVERTERS[type_name]
    same_unit = unit == TYPE_UNITS[type_name]

    def convert(value: Any) -> int:
        if same_unit and isinstance(value, int) and not isinstance(value, bool):
            return value  # an epoch number already in the unit Avro stores
        micros = _epoch_us(value) if isinstance(value, datetime) else to_us(value)
        return micros * PER_US[unit] // US_PER[unit]

    return convert


def _unscaled(value: Any, scale: int) -> int:
    """The unscaled integer of a number at `scale`, exactly (no context precision applies)."""
    number = Decimal(str(value) if isinstance(value, float) else value)
    if not number.is_finite():
        raise FieldValueError((), "a value is not a finite number")
    sign, digits, exponent = number.as_tuple()
    unscaled, shift = int("".join(map(str, digits)) or "0"), int(exponent) + scale
    if shift >= 0:
        unscaled *= 10**shift
    else:
        unscaled, rest = divmod(unscaled, 10**-shift)
        if rest:
            raise FieldValueError((), f"a value has more than {scale} fraction digits")
    return -unscaled if sign else unscaled


def _decimal_writer(scale: int, precision: int, size: int | None) -> Convert:
    from_json = CONVERTERS[TypeName.BINARY]
    limit = 10**precision

    def convert(value: Any) -> bytes:
        if isinstance(value, (str, bytes)):
            unscaled = int.from_bytes(from_json(value), "big", signed=True)
        else:
            unscaled = _unscaled(value, scale)
        if abs(unscaled) >= limit:
            raise FieldValueError((), f"a value has more than {precision} digits")
        length = size if size is not None else unscaled.bit_length() // 8 + 1
        return unscaled.to_bytes(length, "big", signed=True)

    return convert
