"""Column types for Delta tables, as arrow type names, and typed arrow tables from JSON rows.

A type name is a short string (`"int64"`, `"timestamp_us_utc"`, `"decimal(10,2)"`) so that it
travels as JSON next to the decoded rows. Names come from a Kafka Connect schema
(`connectors.delta.connect_types`) or from the data (`infer_types`); `arrow_type` resolves them and
`rows_to_table` converts JSON values (base64 bytes, epoch numbers, ISO text) into typed columns.
Every column is nullable: a field's `optional` flag is deliberately ignored.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

PLAIN_TEXT = r"^[ !#-\[\]-~]*$"  # printable ASCII without '"' and '\': its JSON text is itself in quotes


class TypeName:
    """Arrow type names used in `types` maps."""

    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    BOOL = "bool"
    STRING = "string"
    BINARY = "binary"
    DATE32 = "date32"
    TIMESTAMP_MS = "timestamp_ms"
    TIMESTAMP_US = "timestamp_us"
    TIMESTAMP_NS = "timestamp_ns"
    TIMESTAMP_US_UTC = "timestamp_us_utc"

    INTEGERS = (INT8, INT16, INT32, INT64)
    FLOATS = (FLOAT32, FLOAT64)


DEFAULT_DECIMAL_PRECISION = 38
MAX_DECIMAL128_PRECISION = 38
DECIMAL_PATTERN = re.compile(r"^decimal\((\d+),(-?\d+)\)$")

ARROW_TYPES: dict[str, pa.DataType] = {
    TypeName.INT8: pa.int8(),
    TypeName.INT16: pa.int16(),
    TypeName.INT32: pa.int32(),
    TypeName.INT64: pa.int64(),
    TypeName.FLOAT32: pa.float32(),
    TypeName.FLOAT64: pa.float64(),
    TypeName.BOOL: pa.bool_(),
    TypeName.STRING: pa.string(),
    TypeName.BINARY: pa.binary(),
    TypeName.DATE32: pa.date32(),
    # Naive timestamps land as microseconds without zone (Delta timestamp_ntz).
    TypeName.TIMESTAMP_MS: pa.timestamp("us"),
    TypeName.TIMESTAMP_US: pa.timestamp("us"),
    TypeName.TIMESTAMP_NS: pa.timestamp("us"),
    TypeName.TIMESTAMP_US_UTC: pa.timestamp("us", tz="UTC"),
}

EPOCH_DATE = date(1970, 1, 1)
EPOCH_UTC = datetime(1970, 1, 1, tzinfo=timezone.utc)
ONE_MICROSECOND = timedelta(microseconds=1)
ISO_FRACTION = re.compile(r"^(.*T\d\d:\d\d:\d\d)\.(\d+)(.*)$")
US_PER_MS = 1_000
NS_PER_US = 1_000
UTC_SUFFIX = "Z"
UTC_OFFSET = "+00:00"
COMPACT_SEPARATORS = (",", ":")


def decimal_type_name(precision: int, scale: int) -> str:
    """The type name of a decimal column: `decimal(p,s)`."""
    return f"decimal({precision},{scale})"


def arrow_type(name: str) -> pa.DataType:
    """The arrow type for a type name; raises `ValueError` for an unknown name."""
    if name in ARROW_TYPES:
        return ARROW_TYPES[name]
    match = DECIMAL_PATTERN.match(name) if isinstance(name, str) else None
    if match is None:
        raise ValueError(f"unknown column type {name!r}")
    precision, scale = int(match[1]), int(match[2])
    if precision <= MAX_DECIMAL128_PRECISION:
        return pa.decimal128(precision, scale)
    return pa.decimal256(precision, scale)


def _value_type(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return TypeName.BOOL
    if isinstance(value, int):
        return TypeName.INT64
    if isinstance(value, float):
        return TypeName.FLOAT64
    return TypeName.STRING


def _combine_inferred(seen: set[str]) -> str:
    if len(seen) == 1:
        return next(iter(seen))
    if seen == {TypeName.INT64, TypeName.FLOAT64}:
        return TypeName.FLOAT64
    return TypeName.STRING


def inferred_kinds(rows: list[dict]) -> dict[str, set[str]]:
    """Per column (in order of first appearance), the type names its non-null values suggest."""
    seen: dict[str, set[str]] = {}
    for row in rows:
        for column, value in (row or {}).items():
            kinds = seen.setdefault(column, set())
            kind = _value_type(value)
            if kind is not None:
                kinds.add(kind)
    return seen


def types_from_kinds(seen: dict[str, set[str]]) -> dict[str, str]:
    """Column types from `inferred_kinds` (of one or several row sets, unioned per column)."""
    return {
        column: _combine_inferred(kinds) if kinds else TypeName.STRING
        for column, kinds in seen.items()
    }


def infer_types(rows: list[dict]) -> dict[str, str]:
    """Column types from the values of JSON rows, columns in order of first appearance.

    bool, int, float and str map to their arrow names; ints mixed with floats give float64;
    nested values, other mixtures and all-null columns give string.
    """
    return types_from_kinds(inferred_kinds(rows))


def _widen_decimals(old: str, new: str) -> str:
    """Two decimal types (a source column's precision or scale changed): one holding both, as long as
    it fits 128 bits; else the old one."""
    old_match, new_match = DECIMAL_PATTERN.match(old), DECIMAL_PATTERN.match(new)
    if old_match is None or new_match is None:
        return old
    (old_precision, old_scale), (new_precision, new_scale) = map(int, old_match.groups()), map(int, new_match.groups())
    scale = max(old_scale, new_scale)
    precision = max(old_precision - old_scale, new_precision - new_scale) + scale
    return decimal_type_name(precision, scale) if precision <= MAX_DECIMAL128_PRECISION else old


def _widen(old: str, new: str) -> str:
    numeric = TypeName.INTEGERS + TypeName.FLOATS
    if old in TypeName.INTEGERS and new in TypeName.INTEGERS:
        return TypeName.INT64
    if old in numeric and new in numeric:
        return TypeName.FLOAT64
    return _widen_decimals(old, new)


def merge_types(old: dict[str, str], new: dict[str, str]) -> dict[str, str]:
    """Union of two type maps: old columns first, new ones appended.

    A conflict widens integers to int64, integer/float mixtures to float64 and two decimals to one
    holding both (records from before and after a source column's type change); any other
    conflict keeps the old type.
    """
    merged = dict(old)
    for column, kind in new.items():
        previous = merged.get(column)
        merged[column] = kind if previous is None or previous == kind else _widen(previous, kind)
    return merged


Converter = Callable[[Any], Any]


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError
    return value


def _floating(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError
    return float(value)


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError
    return value


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=COMPACT_SEPARATORS)


def _binary(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise TypeError
    return base64.b64decode(value, validate=True)


def _decimal_converter(scale: int) -> Converter:
    def convert(value: Any) -> Decimal:
        if isinstance(value, Decimal):
            return value
        unscaled = int.from_bytes(_binary(value), "big", signed=True)
        sign, digits, _ = Decimal(unscaled).as_tuple()
        # Built from the tuple so that no context precision can round the value.
        return Decimal((sign, digits, -scale))

    return convert


def _epoch_days(value: Any) -> int:
    if isinstance(value, str):
        return (date.fromisoformat(value) - EPOCH_DATE).days
    return _integer(value)


def _epoch_us(dt: datetime) -> int:
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return (dt - EPOCH_UTC) // ONE_MICROSECOND


def _parse_iso(value: str) -> datetime:
    """ISO-8601 text with a trailing `Z` and any number of fraction digits (cut to 6)."""
    match = ISO_FRACTION.match(value)
    if match is not None:
        head, fraction, tail = match.groups()
        value = f"{head}.{fraction[:6].ljust(6, '0')}{tail}"
    if value.endswith(UTC_SUFFIX):
        value = value[: -len(UTC_SUFFIX)] + UTC_OFFSET
    return datetime.fromisoformat(value)


def _timestamp_converter(to_us: Callable[[int], int]) -> Converter:
    def convert(value: Any) -> int:
        if isinstance(value, str):
            return _epoch_us(_parse_iso(value).replace(tzinfo=None))
        return to_us(_integer(value))

    return convert


def _zoned_timestamp(value: Any) -> int:
    if isinstance(value, str):
        return _epoch_us(_parse_iso(value))
    return _integer(value)


CONVERTERS: dict[str, Converter] = {
    **{name: _integer for name in TypeName.INTEGERS},
    **{name: _floating for name in TypeName.FLOATS},
    TypeName.BOOL: _boolean,
    TypeName.STRING: _text,
    TypeName.BINARY: _binary,
    TypeName.DATE32: _epoch_days,
    TypeName.TIMESTAMP_MS: _timestamp_converter(lambda ms: ms * US_PER_MS),
    TypeName.TIMESTAMP_US: _timestamp_converter(lambda us: us),
    TypeName.TIMESTAMP_NS: _timestamp_converter(lambda ns: ns // NS_PER_US),
    TypeName.TIMESTAMP_US_UTC: _zoned_timestamp,
}


def _converter(name: str, data_type: pa.DataType) -> Converter:
    if name in CONVERTERS:
        return CONVERTERS[name]
    return _decimal_converter(data_type.scale)


def typed_column(name: str, type_name: str, values: list[Any]) -> pa.Array:
    """One column of JSON values converted to `type_name`; `ValueError` names the column."""
    data_type = arrow_type(type_name)
    convert = _converter(type_name, data_type)
    try:
        converted = [None if v is None else convert(v) for v in values]
        return pa.array(converted, type=data_type)
    # No value text in the message: rows may carry personal data.
    except (TypeError, ValueError, OverflowError, binascii.Error, pa.ArrowException):
        raise ValueError(f"column {name!r}: a value cannot be converted to {type_name}") from None


def rows_to_table(rows: list[dict | None], types: dict[str, str]) -> pa.Table:
    """A table with exactly the columns of `types`, in order, from JSON rows.

    Missing keys and `None` rows give nulls; keys not in `types` are ignored. Raises
    `ValueError` naming the column and the type when a value cannot be converted.
    """
    arrays = [
        typed_column(name, type_name, [row.get(name) if row else None for row in rows])
        for name, type_name in types.items()
    ]
    schema = pa.schema([pa.field(name, array.type) for name, array in zip(types, arrays)])
    return pa.Table.from_arrays(arrays, schema=schema)


_INTEGER_WIDTH = {pa.int8(): 8, pa.int16(): 16, pa.int32(): 32, pa.int64(): 64}


def one_array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """`values` as one array (a chunked column's chunks joined; a single chunk as it is)."""
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    return values


_MAX_BINARY_BYTES = 2**31 - 1  # a binary array's int32 offsets


def binary_array(values: list[bytes]) -> pa.Array:
    """Python bytes (none missing) as one binary array: the values joined once, their offsets summed in numpy.
    `pa.array` grows its buffer value by value, which on the C library's allocator (the service's,
    `service/runtime/allocators.py`) costs several times the copy itself."""
    lengths = np.fromiter(map(len, values), np.int64, len(values))
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > _MAX_BINARY_BYTES:
        return pa.array(values, pa.binary())  # beyond int32 offsets: pyarrow chunks or refuses as it does
    return pa.Array.from_buffers(pa.binary(), len(values),
                                 [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(values))])


def plain_type(kind: pa.DataType) -> pa.DataType:
    """One type per family of Arrow representations Delta stores alike."""
    if pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind):
        return pa.binary()
    return kind


def widens(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether a column of type `old` can become `new` without losing a value, as a Delta type change:
    a wider integer, float32 -> float64, a decimal with more integer and fraction digits (Delta's rule:
    scale up by at most as much as precision). Date -> timestamp is not one (the values change)."""
    old, new = plain_type(old), plain_type(new)
    if old == new:
        return False
    if old in _INTEGER_WIDTH and new in _INTEGER_WIDTH:
        return _INTEGER_WIDTH[new] > _INTEGER_WIDTH[old]
    if old == pa.float32() and new == pa.float64():
        return True
    if pa.types.is_decimal128(old) and pa.types.is_decimal128(new):
        return (new.precision <= MAX_DECIMAL128_PRECISION and new.scale >= old.scale
                and new.precision - new.scale >= old.precision - old.scale)
    return False


def string_list_texts(column: pa.ListArray) -> pa.Array:
    """Lists of strings as compact JSON, as `json.dumps` writes them (`typed_column`'s text of a list): an
    item of printable ASCII without a quote or a backslash is itself in quotes (vectorised); any other item
    (non-ASCII, escapes) is written by `json.dumps`, once per distinct such item."""
    items = column.flatten()  # the elements of the valid lists, in order
    quoted = pc.binary_join_element_wise('"', items, '"', "")
    plain = pc.match_substring_regex(items, PLAIN_TEXT)
    odd = pc.invert(pc.fill_null(plain, True))
    if pc.any(odd).as_py():  # each distinct such item written once (list items repeat: tags, codes, enums)
        escaping = items.filter(odd)
        distinct = pc.unique(escaping)
        written = pa.array([json.dumps(item) for item in distinct.to_pylist()], pa.string())
        quoted = pc.replace_with_mask(quoted, odd, written.take(pc.index_in(escaping, value_set=distinct)))
    quoted = pc.fill_null(quoted, "null")
    lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy()
    offsets = np.zeros(len(column) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), quoted), ",")
    texts = pc.binary_join_element_wise("[", joined, "]", "")
    return texts if not column.null_count else pc.if_else(column.is_valid(), texts, pa.scalar(None, pa.string()))
