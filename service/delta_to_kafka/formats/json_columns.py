"""Exact JSON text of whole Arrow columns: one fragment per value, no Python object per row.

A fragment is byte for byte what `output_formats.JsonSerializer` writes for the value
(`orjson` of `json_ready(value)`), so records assembled from fragments equal records built
from Python dicts. Vectorized with Arrow compute: integers, booleans, float64 values that
orjson writes in plain notation (0, and 1e-5 <= |v| < 1e15), strings without control
characters, decimals (Arrow's plain text, as `format(value, "f")`), dates, microsecond
timestamps of years 1000 and later (`strftime`, a `Z` when zoned), lists of any of these,
nulls. Every other value (other types, floats in exponent notation or not finite, strings
with control characters, timestamps before the year 1000, which Python writes without
leading zeros) is converted one value at a time through `json_ready`; a column of such a
type costs what the row path costs, only for that column.

`join` and `json_object` put fragments together into objects, again column by column.
"""

from __future__ import annotations

import json
from typing import Any, Sequence, Union

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from service.delta_to_kafka.formats.output_formats import json_ready

NULL = "null"
Text = Union[pa.Array, str]
"""A column of JSON texts, or one text for every row."""

_PLAIN_FLOAT_MIN = 1e-5  # orjson writes smaller magnitudes in exponent notation
_PLAIN_FLOAT_LIMIT = 1e15  # ... and these and larger ones
_FIRST_PRINTABLE = 0x20  # orjson escapes the bytes below; Arrow replacements below do not
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_SCAN_BLOCK = 1 << 20  # bytes of string data scanned for bytes to escape at a time
_FIRST_PADDED_YEAR = 1000  # Python's strftime writes earlier years without leading zeros
_DATE_END = 10  # Arrow's text of a timestamp: `YYYY-MM-DD HH:MM:SS.ffffff` (microseconds), for years >= 1000


def dump(value: Any) -> str:
    """The exact JSON text of one Python value (raises TypeError when it has none)."""
    ready = json_ready(value)
    try:
        return orjson.dumps(ready).decode("utf-8")
    except orjson.JSONEncodeError:  # integers beyond 64 bits, as JsonSerializer does
        return json.dumps(ready, separators=(",", ":"), ensure_ascii=False)


def _one_by_one(column: pa.Array) -> pa.Array:
    return pa.array([NULL if value is None else dump(value) for value in column.to_pylist()], pa.string())


def _floats(column: pa.Array) -> tuple[pa.Array, pa.Array]:
    text = pc.cast(column, pa.string())
    magnitude = pc.abs(column)
    plain = pc.or_(pc.equal(column, 0.0),
                   pc.and_(pc.greater_equal(magnitude, _PLAIN_FLOAT_MIN), pc.less(magnitude, _PLAIN_FLOAT_LIMIT)))
    odd = pc.or_(pc.invert(plain), pc.match_substring(text, "e"))
    whole = pc.invert(pc.match_substring(text, "."))
    return pc.if_else(whole, pc.binary_join_element_wise(text, ".0", ""), text), odd


def _escape_rows(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a string column holding a byte to escape (a quote, a backslash or a control
    character), and those holding a control character (orjson escapes those, Arrow's replacements
    do not: such a value goes one by one)."""
    if len(column) == 0 or column.buffers()[2] is None:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32)[column.offset:column.offset + len(column) + 1]
    data = np.frombuffer(column.buffers()[2], dtype=np.uint8)
    # Whole rows a block at a time (the masks stay a few MB, not several times the column's text), and
    # one flag per row from the block's byte mask: a JSON text column holds quotes in every row, and a
    # position per quote cost more than the scan.
    starts = np.searchsorted(offsets, np.arange(offsets[0], offsets[-1], _SCAN_BLOCK), side="right") - 1
    cuts = np.unique(np.concatenate(([0], starts)))  # the rows that begin a block
    escaping, control = [], []
    for first, end in zip(cuts.tolist(), [*cuts[1:].tolist(), len(column)]):
        block = data[offsets[first]:offsets[end]]
        controls = block < _FIRST_PRINTABLE
        marked = controls | (block == _QUOTE)
        marked |= block == _BACKSLASH
        escaping.append(first + _rows_marked(marked, offsets[first:end + 1]))
        if controls.any():
            control.append(first + _rows_marked(controls, offsets[first:end + 1]))
    return np.concatenate(escaping), np.concatenate(control) if control else np.zeros(0, dtype=np.int64)


def _rows_marked(marked: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The rows (positions in `offsets`, which start at the first byte of `marked`) holding a marked byte."""
    starts = offsets[:-1] - offsets[0]
    filled = np.flatnonzero(offsets[1:] > offsets[:-1])  # empty rows hold nothing, and reduceat needs starts < size
    if filled.size == 0 or not marked.any():
        return np.zeros(0, dtype=np.int64)
    return filled[np.logical_or.reduceat(marked, starts[filled])]


def _mask(length: int, rows: np.ndarray) -> pa.Array:
    mask = np.zeros(length, dtype=bool)
    mask[rows] = True
    return pa.array(mask)


def _escaped(column: pa.Array) -> pa.Array:
    return pc.replace_substring(pc.replace_substring(column, "\\", "\\\\"), '"', '\\"')


def _strings(column: pa.Array) -> tuple[pa.Array, pa.Array]:
    escaping, control = _escape_rows(column)
    if escaping.size * 2 > len(column):
        column = _escaped(column)
    elif escaping.size:  # only rows with a quote, a backslash or a control character are rewritten
        column = pc.replace_with_mask(column, _mask(len(column), escaping), _escaped(column.take(pa.array(escaping))))
    return pc.binary_join_element_wise('"', column, '"', ""), _mask(len(column), control)


def _quoted(text: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise('"', text, '"', "")


def _timestamps(column: pa.Array) -> tuple[pa.Array, pa.Array]:
    utc = pc.cast(column, pa.timestamp("us"))  # a zoned timestamp's instant as UTC wall time
    text = pc.utf8_replace_slice(pc.cast(utc, pa.string()), _DATE_END, _DATE_END + 1, "T")
    if column.type.tz is not None:
        text = pc.binary_join_element_wise(text, "Z", "")
    return _quoted(text), pc.less(pc.year(utc), _FIRST_PADDED_YEAR)


def _lists(column: pa.Array) -> pa.Array:
    items = json_fragments(column.values)
    joined = pc.binary_join(type(column).from_arrays(column.offsets, items, mask=column.is_null()), ",")
    return pc.binary_join_element_wise("[", joined, "]", "")


def json_fragments(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The JSON text of every value of `column` ("null" for nulls); TypeError if a value has none."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = column.type
    odd = None
    if pa.types.is_integer(kind):
        text = pc.cast(column, pa.string())
    elif pa.types.is_boolean(kind):
        text = pc.if_else(column, "true", "false")
    elif pa.types.is_float64(kind):
        text, odd = _floats(column)
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        text, odd = _strings(pc.cast(column, pa.string()))
    elif pa.types.is_decimal(kind):
        text = _quoted(pc.cast(column, pa.string()))
    elif pa.types.is_date32(kind):
        text = _quoted(pc.cast(column, pa.string()))
    elif pa.types.is_timestamp(kind) and kind.unit in ("s", "ms", "us"):
        text, odd = _timestamps(column)
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        text = _lists(column)
    else:
        return _one_by_one(column)
    text = pc.fill_null(text, NULL)
    if odd is None:
        return text
    mask = pc.fill_null(odd, False)
    picked = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
    if picked.size == 0:
        return text
    return pc.replace_with_mask(text, mask, _one_by_one(column.take(pa.array(picked))))


def key_text(name: str) -> str:
    """The JSON text of a field name followed by the colon."""
    return dump(str(name)) + ":"


def join(pieces: Sequence[Text], null: str | None = None) -> pa.Array | str:
    """The row-wise concatenation of texts; a null in a piece gives null, or with `null` stands for that text."""
    if all(isinstance(piece, str) for piece in pieces):
        return "".join(pieces)  # type: ignore[arg-type]
    if null is None:
        return pc.binary_join_element_wise(*pieces, "")
    return pc.binary_join_element_wise(*pieces, "", null_handling="replace", null_replacement=null)


def json_object(fields: Sequence[tuple[str | None, Text | list[Text]]], null: str | None = None) -> pa.Array | str:
    """`{"name":value,...}` row by row; a field named None is a run of members inserted as it is.

    A value may be a list of texts (an object's pieces, e.g. an image's members taken at its
    rows), joined in place: the value is not joined on its own first and copied again here.
    A null value gives a null object, or with `null` is written as that text (`join`)."""
    pieces: list[Text] = ["{"]
    for index, (name, value) in enumerate(fields):
        pieces.append(("," if index else "") + ("" if name is None else key_text(name)))
        if isinstance(value, list):
            pieces += value
        else:
            pieces.append(value)
    pieces.append("}")
    return join(pieces, null)
