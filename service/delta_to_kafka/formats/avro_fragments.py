"""Avro binary encoding of whole Arrow columns: one binary value per row, no Python object per row.

An Avro record's body is its fields' encodings one after the other, so a column of record
bodies is the row-wise concatenation of its fields' columns. `record_bytes` walks a parsed
schema (`fastavro.parse_schema`, named types in `named`) over a document of columns: a field's
node is a typed Arrow array, a `Columns` (a nested record, with the rows where it is present),
a Python constant for every row, or absent (null). The bytes are fastavro's for the value the
row path writes (`avro_values.writer` then `fastavro.schemaless_writer`):

- vectorised with numpy and Arrow compute: `["null", T]` unions (null first, as the export's
  schemas are), long and int from integers, `date` from date32, `timestamp-micros` and
  `local-timestamp-micros` from s/ms/us timestamps, double, boolean, string from strings,
  bytes from binaries, `decimal` bytes from decimal128 of at most 18 digits at the schema's
  scale (the row path's length, `bit_length // 8 + 1`, big-endian two's complement);
- a list of strings in an Avro string (the row path writes its compact `json.dumps` text):
  each distinct item dumped once, joined per row with Arrow's list join;
- any other pairing of Arrow type and Avro type is written value by value through the row
  path's converter and fastavro, for that column only.

A field's encoding is a list of pieces (columns or constants) whose row-wise concatenation is
the encoding; a null in a column piece is an empty piece. A record's pieces are its fields'
pieces, a `[null, record]` field's are the union tags and the record's pieces with the absent
rows' validity cleared (no data copied), so a whole value is concatenated once (`framed`) and
a long string is copied once, not once per nesting level.

A value the row path refuses (a decimal with more digits than the schema allows, a required
field that is null) raises TypeError, so the caller falls back to the row path, which names it.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any, Union

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.schema_registry import avro_values
from connectors.schema_registry.avro_codec import without_logical_types
from connectors.schema_registry.avro_types import AVRO_NULL, LOGICAL_TYPE, resolve

Bytes = Union[pa.Array, bytes]
"""A column of Avro encodings, or one encoding for every row."""

_NULL, _PRESENT = b"\x00", b"\x02"  # union branch 0 (null) and 1, zigzag varints
_MAX_VARINT = 10
_DECIMAL_BYTES = 8
_MAX_FAST_DIGITS = 18  # an unscaled value of at most 18 digits fits an int64
_MICROS = ("timestamp-micros", "local-timestamp-micros")
_NONE = b""


@dataclass(frozen=True)
class Columns:
    """A nested record's fields as nodes; `present`: rows where the record is not null (None: all)."""

    fields: dict[str, Any]
    present: pa.Array | None = None


def _ragged(data: np.ndarray, lengths: np.ndarray) -> pa.Array:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.Array.from_buffers(pa.binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def varints(values: np.ndarray) -> pa.Array:
    """Zigzag varints (Avro long and int) of int64 values."""
    values = values.astype(np.int64, copy=False)
    zigzag = ((values << 1) ^ (values >> 63)).view(np.uint64)
    lengths = np.ones(len(values), np.int64)
    for group in range(1, _MAX_VARINT):
        longer = zigzag >= np.uint64(1 << (7 * group))
        if not longer.any():
            break
        lengths += longer
    width = int(lengths.max()) if len(values) else 1
    if width == 1:
        return _ragged(zigzag.astype(np.uint8), lengths)
    shifts = (np.arange(width, dtype=np.uint64) * np.uint64(7))[None, :]
    groups = ((zigzag[:, None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)
    place = np.arange(width)[None, :]
    groups |= (place < (lengths[:, None] - 1)).astype(np.uint8) << np.uint8(7)
    return _ragged(groups[place < lengths[:, None]], lengths)


def _join(pieces: list[Bytes]) -> Bytes:
    """Pieces concatenated row by row; a null in a column piece is an empty piece in that row."""
    pieces = _merged(pieces)
    if all(isinstance(piece, bytes) for piece in pieces):
        return b"".join(pieces)  # type: ignore[arg-type]
    if len(pieces) == 1:
        return pc.fill_null(pieces[0], pa.scalar(_NONE, pa.binary()))
    return pc.binary_join_element_wise(*[pa.scalar(p, pa.binary()) if isinstance(p, bytes) else p for p in pieces],
                                       pa.scalar(_NONE, pa.binary()), null_handling="replace", null_replacement="")


def _merged(pieces: list[Bytes]) -> list[Bytes]:
    """Neighbouring constant pieces as one."""
    merged: list[Bytes] = []
    for piece in pieces:
        if isinstance(piece, bytes) and merged and isinstance(merged[-1], bytes):
            merged[-1] += piece
        else:
            merged.append(piece)
    return merged


def _masked(piece: Bytes, present: pa.Array) -> pa.Array:
    """A piece empty (null) in the rows where `present` is false; the column's data is not copied."""
    if isinstance(piece, bytes):
        return pc.if_else(present, pa.scalar(piece, pa.binary()), pa.scalar(None, pa.binary()))
    keep = present if piece.null_count == 0 else pc.and_(present, piece.is_valid())
    bits = np.concatenate([np.zeros(piece.offset, bool), keep.to_numpy(zero_copy_only=False)])
    validity = pa.py_buffer(np.packbits(bits, bitorder="little"))
    return pa.Array.from_buffers(piece.type, len(piece), [validity, *piece.buffers()[1:]], offset=piece.offset)


def _integers(column: pa.Array) -> np.ndarray:
    return pc.fill_null(column, 0).to_numpy(zero_copy_only=False).astype(np.int64)


def _with_length(body: pa.Array) -> list[Bytes]:
    return [varints(_integers(pc.binary_length(body))), body]


def _decimals(column: pa.Array, precision: int) -> list[Bytes]:
    words = np.frombuffer(column.buffers()[1], dtype="<i8")[2 * column.offset:2 * (column.offset + len(column))]
    unscaled = np.where(column.is_valid().to_numpy(zero_copy_only=False), words[::2], 0)
    magnitude = np.abs(unscaled)
    if (magnitude >= 10**precision).any():
        raise TypeError(f"a decimal has more than {precision} digits")
    lengths = np.ones(len(unscaled), np.int64)
    for size in range(1, _DECIMAL_BYTES):
        lengths += magnitude >= (1 << (8 * size - 1))
    big_endian = unscaled.astype(">i8").view(np.uint8).reshape(-1, _DECIMAL_BYTES)
    keep = np.arange(_DECIMAL_BYTES)[None, :] >= (_DECIMAL_BYTES - lengths[:, None])
    return [varints(lengths), _ragged(big_endian[keep], lengths)]


def _fixed(column: pa.Array, dtype: str) -> pa.Array:
    data = pc.fill_null(column, 0).to_numpy(zero_copy_only=False).astype(dtype)
    return _ragged(data.view(np.uint8), np.full(len(data), data.itemsize, np.int64))


def _longs(arrow: pa.DataType, column: pa.Array) -> bool:
    """Integers that are Avro longs as they are (a uint64 column only below 2**63)."""
    if not pa.types.is_integer(arrow):
        return False
    return arrow != pa.uint64() or (pc.max(column).as_py() or 0) < 2**63


def _fast(schema: Any, column: pa.Array) -> list[Bytes] | None:
    """The encodings of a non-null type's values by kernels, as pieces; None when this pairing has none.

    The pieces hold some encoding in null rows: the caller masks them."""
    kind = schema.get("type") if isinstance(schema, dict) else schema
    logical = schema.get(LOGICAL_TYPE) if isinstance(schema, dict) else None
    arrow = column.type
    if kind in ("long", "int") and logical is None and _longs(arrow, column):
        return [varints(_integers(column))]
    if kind == "int" and logical == "date" and pa.types.is_date32(arrow):
        return [varints(_integers(column.cast(pa.int32())))]
    if kind == "long" and logical in _MICROS and pa.types.is_timestamp(arrow) and arrow.unit in ("s", "ms", "us"):
        return [varints(_integers(column.cast(pa.timestamp("us", tz=arrow.tz)).cast(pa.int64())))]
    if kind == "double" and logical is None and pa.types.is_float64(arrow):
        return [_fixed(column, "<f8")]
    if kind == "boolean" and pa.types.is_boolean(arrow):
        return [pc.if_else(column, pa.scalar(b"\x01", pa.binary()), pa.scalar(b"\x00", pa.binary()))]
    if kind == "string" and logical is None and pa.types.is_string(arrow):
        return _with_length(column.cast(pa.binary()))
    if kind == "bytes" and logical is None and pa.types.is_binary(arrow):
        return _with_length(column)
    if (kind == "bytes" and logical == "decimal" and pa.types.is_decimal128(arrow)
            and arrow.scale == schema.get("scale", 0) and schema["precision"] <= _MAX_FAST_DIGITS):
        return _decimals(column, schema["precision"])
    return None


def _list_text(schema: Any, column: pa.Array) -> list[Bytes] | None:
    """A list of strings as the row path's JSON text (`json.dumps`, compact, ASCII) in an Avro string.

    Each distinct item is dumped once (the row path's `json.dumps` of a string or None); a row's
    text is its items' texts joined by commas in brackets, which is what `json.dumps` writes for
    the list."""
    kind = schema.get("type") if isinstance(schema, dict) else schema
    arrow = column.type
    if kind != "string" or not pa.types.is_list(arrow) or not pa.types.is_string(arrow.value_type):
        return None
    items = column.values
    distinct = pc.unique(items)
    texts = pa.array([json.dumps(item) for item in distinct.to_pylist()], pa.string())
    item_texts = texts.take(pc.index_in(items, value_set=distinct))
    joined = pc.binary_join(pa.ListArray.from_arrays(column.offsets, item_texts), ",")
    text = pc.binary_join_element_wise("[", joined, "]", "").cast(pa.binary())
    return _with_length(text)


def _one_by_one(schema: Any, column: pa.Array, named: dict[str, Any]) -> pa.Array:
    """The row path's bytes of each value of `column` (converter, then fastavro)."""
    convert = avro_values.writer(schema, named)
    raw = fastavro.parse_schema(without_logical_types(schema))
    encoded = []
    for value in column.to_pylist():
        stream = io.BytesIO()
        try:
            prepared = value if convert is None or value is None else convert(value)
            fastavro.schemaless_writer(stream, raw, prepared)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError, ArithmeticError) as error:
            raise TypeError(f"a value does not fit its Avro type ({type(error).__name__})") from None
        encoded.append(stream.getvalue())
    return pa.array(encoded, pa.binary())


def _constant(schema: Any, value: Any, named: dict[str, Any]) -> bytes:
    return _one_by_one(schema, pa.array([value]), named)[0].as_py()


def _kernels(schema: Any, column: pa.Array) -> list[Bytes] | None:
    fast = _fast(schema, column)
    return _list_text(schema, column) if fast is None else fast


def _tags(present: pa.Array) -> pa.Array:
    return pc.if_else(present, pa.scalar(_PRESENT, pa.binary()), pa.scalar(_NULL, pa.binary()))


def _nullable(schema: list, node: Any, length: int, named: dict[str, Any]) -> list[Bytes]:
    branch = resolve(schema[1], named)
    if node is None:
        return [_NULL]
    if isinstance(node, Columns):
        body, present = record_pieces(branch, node, length, named), node.present
    elif isinstance(node, pa.Array):
        fast = _kernels(branch, node)
        if fast is None:
            return [_one_by_one(schema, node, named)]
        body, present = fast, (node.is_valid() if node.null_count else None)
    else:
        return [_PRESENT + _constant(branch, node, named)]
    if present is None:
        return [_PRESENT, *body]
    return [_tags(present), *(_masked(piece, present) for piece in _merged(body))]


def field_pieces(schema: Any, node: Any, length: int, named: dict[str, Any]) -> list[Bytes]:
    """The encodings of one field's node under its (parsed) schema, as pieces to concatenate."""
    if isinstance(schema, list):
        if len(schema) != 2 or schema[0] != AVRO_NULL:
            raise TypeError("only [null, T] unions are encoded column by column")
        return _nullable(schema, node, length, named)
    schema = resolve(schema, named)
    if isinstance(node, Columns):
        return record_pieces(schema, node, length, named)
    if node is None or (isinstance(node, pa.Array) and node.null_count):
        raise TypeError("a required Avro field is null")
    if isinstance(node, pa.Array):
        fast = _kernels(schema, node)
        return [_one_by_one(schema, node, named)] if fast is None else fast
    return [_constant(schema, node, named)]


def record_pieces(schema: Any, document: Columns, length: int, named: dict[str, Any]) -> list[Bytes]:
    """Record bodies, row by row, of a document of columns under a parsed record schema, as pieces.

    Concatenated once (`framed`), so a long value is copied once, not once per nesting level."""
    schema = resolve(schema, named)
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise TypeError("a nested value is not an Avro record")
    extra = document.fields.keys() - {field["name"] for field in schema["fields"]}
    if extra:
        raise TypeError(f"fields {sorted(extra)} are not in the Avro schema")
    return [piece for field in schema["fields"]
            for piece in field_pieces(field["type"], document.fields.get(field["name"]), length, named)]


def record_bytes(schema: Any, document: Columns, length: int, named: dict[str, Any]) -> Bytes:
    """Record bodies, row by row, of a document of columns under a parsed record schema."""
    return _join(record_pieces(schema, document, length, named))


def framed(schema_id: int, bodies: list[Bytes], length: int) -> pa.Array:
    """Confluent-framed values of record bodies given as pieces: magic byte, the schema id (4 bytes, big-endian), the body."""
    header = b"\x00" + schema_id.to_bytes(4, "big")
    joined = _join([header, *bodies])
    return joined if isinstance(joined, pa.Array) else pa.array([joined] * length, pa.binary())
