"""Debezium / Kafka Connect JSON values, as `pyarrow.json` parsed a whole column, -> typed Arrow columns.

The vectorised twin of `connectors.delta.arrow_types.typed_column` for the plain path's fast way
(`debezium_columns`): `parse_type` says what Arrow type to parse a declared column as, and
`bulk_column` turns the parsed column into the declared type with numpy and `pyarrow.compute`
over the whole column (base64 bytes and decimals, epoch-coded and ISO text timestamps, ranges of
integers), instead of one Python call per value.

It never guesses: a value it cannot convert exactly as the reference would is a *misfit* (typed
as null, flagged in a mask), and the caller decodes that record the reference way, which decides
errors and policies. A misfit is not an error; it only costs speed. So the rules below are a
subset of what the reference accepts, never a superset:

- integers: out of the type's range (`row_fit.INT_RANGES`) -> misfit;
- floats: an infinite value (an integer literal too large for a float, which the reference
  refuses) -> misfit;
- text: bytes that are not UTF-8 -> misfit;
- base64 (bytes, decimals): only canonical base64 (groups of four alphabet characters, `=` padding
  in the last group only, zero unused bits) is decoded; a decimal with more bytes than its Arrow
  type (16, or 32 past precision 38), more digits than its precision, or a scale outside
  0..precision -> misfit;
- ISO text (ZonedTimestamp, and dates and naive timestamps written as text): only
  `YYYY-MM-DDTHH:MM:SS[.fraction][Z|+HH:MM|-HH:MM]` with a valid calendar date (year 1 on),
  hour, minute and second (no leap second), and an offset under 24 hours, and `YYYY-MM-DD` for
  dates; anything else -> misfit;
- a column parsed as a type the declared one does not convert from -> every value a misfit;
- nested values of a text column (`json_text`): what Arrow's inference may have changed (see there).
Nulls stay null and are never misfits.

Everything is numpy / `pyarrow.compute` over the whole column but two rare cases, each said
where it happens: text that is not UTF-8 is located value by value, and nested values become
JSON text value by value (`json_text`).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.delta.arrow_types import (
    MAX_DECIMAL128_PRECISION,
    TypeName,
    arrow_type,
    one_array,
    string_list_texts,
)
from service.kafka_to_delta.formats.row_fit import INT_RANGES

_EPOCH_CODED = (TypeName.DATE32, TypeName.TIMESTAMP_MS, TypeName.TIMESTAMP_US, TypeName.TIMESTAMP_NS)
_ISO_TEXT = (TypeName.TIMESTAMP_US_UTC,)
_US_PER_MS = 1_000
_STORAGE = {TypeName.INT8: np.int8, TypeName.INT16: np.int16, TypeName.INT32: np.int32, TypeName.DATE32: np.int32}
_NS_PER_US = 1_000
_US_PER_SECOND = 1_000_000
_US_PER_DAY = 86_400 * _US_PER_SECOND
_FRACTION_DIGITS = 6  # the reference cuts fractions to microseconds
_COMPACT = (",", ":")

_BASE64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_PAIR_BITS = 0xFFF  # two base64 characters carry 12 bits
_ONE_PAD, _TWO_PADS, _BAD_PAIR = 0x4000, 0x2000, 0x8000
_FLAGS = _ONE_PAD | _TWO_PADS | _BAD_PAIR


def _pair_codes() -> np.ndarray:
    """What each two-byte pair (as a little-endian uint16) decodes to: its 12 bits, or a flag: `x=`
    (its 6 bits placed as in a full pair; non-canonical ones, with unused bits set, are bad),
    `==`, or bad."""
    codes = np.full(256, -1, np.int64)
    codes[np.frombuffer(_BASE64_ALPHABET, np.uint8)] = np.arange(64)
    first, second = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")  # first byte, second byte
    high, low = codes[first], codes[second]
    pairs = np.full((256, 256), _BAD_PAIR, np.int64)
    plain = (high >= 0) & (low >= 0)
    pairs[plain] = (high[plain] << 6) | low[plain]
    one_pad = (high >= 0) & (second == ord("=")) & (high & 0b11 == 0)
    pairs[one_pad] = _ONE_PAD | (high[one_pad] << 6)
    pairs[(first == ord("=")) & (second == ord("="))] = _TWO_PADS
    table = np.empty(65536, np.uint16)
    table[(second << 8 | first).ravel()] = pairs.ravel()
    return table


_PAIR_CODES = _pair_codes()

_DATE_LENGTH = 10  # YYYY-MM-DD
_DATE_TIME_LENGTH = 19  # YYYY-MM-DDTHH:MM:SS
_OFFSET_LENGTH = 6  # +HH:MM
_MAX_FRACTION_DIGITS = 9
_READ_AHEAD = 32  # bytes past the last value that fixed-position reads may touch
_DAYS_IN_MONTH = np.array([0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], np.int64)


def parse_type(type_name: str, nested: bool = False) -> pa.DataType | None:
    """The Arrow type `pyarrow.json` should parse a declared column of this type as (explicit schema);
    None: let `pyarrow.json` infer it (a text column holding nested values, which `json_text` turns
    into the reference's JSON text). Raises `ValueError` for an unknown type name.

    Debezium's encodings: integers, floats and booleans as JSON numbers and literals; bytes and
    decimals as base64 text; dates and Timestamp / MicroTimestamp / NanoTimestamp as epoch numbers;
    ZonedTimestamp as ISO text. A range holding another encoding (an epoch number for a
    ZonedTimestamp) makes `pyarrow.json` refuse the parse, and the caller falls back whole.
    """
    target = arrow_type(type_name)
    if type_name in TypeName.INTEGERS or type_name in _EPOCH_CODED:
        return pa.int64()
    if type_name in TypeName.FLOATS:
        return pa.float64()
    if type_name == TypeName.BOOL:
        return pa.bool_()
    if type_name == TypeName.STRING:
        return None if nested else pa.string()
    if type_name == TypeName.BINARY or type_name in _ISO_TEXT or pa.types.is_decimal(target):
        return pa.string()
    raise ValueError(f"no parse type for column type {type_name!r}")


def bulk_column(values: pa.Array | pa.ChunkedArray, type_name: str) -> tuple[pa.Array, np.ndarray]:
    """One column as `pyarrow.json` parsed it -> (typed array of `arrow_type(type_name)`, misfit mask).

    Where the mask is False the typed value equals `typed_column(name, type_name, [the JSON
    value])`; where it is True the typed value is null and the caller decodes that record the
    reference way. Vectorised throughout, except text columns with invalid UTF-8 (located value
    by value, once the whole column failed validation) and text columns parsed as nested values
    (`json_text`).
    """
    column = one_array(values)
    target = arrow_type(type_name)
    if pa.types.is_null(column.type) or not len(column) or column.null_count == len(column):
        return pa.nulls(len(column), target), np.zeros(len(column), np.bool_)
    if type_name == TypeName.STRING:
        if pa.types.is_string(column.type):
            return _text(column)
        return json_text(column)
    if pa.types.is_integer(column.type) and (type_name in INT_RANGES):
        return _from_integers(column, type_name, target)
    if pa.types.is_floating(target) and (pa.types.is_floating(column.type) or pa.types.is_integer(column.type)):
        return _floats(column, target)
    if type_name == TypeName.BOOL and pa.types.is_boolean(column.type):
        return column, np.zeros(len(column), np.bool_)
    if pa.types.is_string(column.type):
        if type_name == TypeName.BINARY:
            return _binary(column)
        if pa.types.is_decimal(target):
            return _decimal(column, target)
        if type_name == TypeName.DATE32:
            return _iso_dates(column)
        if type_name in _EPOCH_CODED or type_name in _ISO_TEXT:
            return _iso_timestamps(column, target, zoned=type_name in _ISO_TEXT)
    return pa.nulls(len(column), target), _valid(column)


def json_lines(payloads: pa.Array) -> bytes:
    """The payloads as newline-delimited JSON text (each followed by a newline)."""
    joined = pc.binary_join_element_wise(payloads, pa.scalar(b"\n"), pa.scalar(b""))
    offsets = np.frombuffer(joined.buffers()[1], dtype=np.int32)[joined.offset:joined.offset + len(joined) + 1]
    return joined.buffers()[2][int(offsets[0]):int(offsets[-1])].to_pybytes()


def json_text(values: pa.Array | pa.ChunkedArray, fixed_key_order: bool = False) -> tuple[pa.Array, np.ndarray]:
    """A text column's values as `pyarrow.json` inferred them (struct, list, scalar) -> the
    reference's text (`_text`: a string as it is, anything else as compact JSON), with a misfit mask.

    Strings, integers and booleans at the top, and lists of strings (a PostgreSQL text[]; items other
    than printable ASCII without a quote or backslash are written one at a time), are converted vectorised. Anything
    else costs one Python `to_pylist` and one `json.dumps` per value (about a microsecond per small
    value, 10 to 50 times the vectorised cost): such columns (Connect struct / map values, other
    arrays, VariableScaleDecimal, Geometry) are rare.

    Arrow's inference loses what the reference keeps, so these are misfits: a value holding a
    timestamp (text Arrow took for a time) or an integral float (Arrow may have widened an integer
    that the reference writes without `.0`), or an infinite one; and, unless `fixed_key_order`, an
    object with two or more keys (Arrow orders an object's keys by their first appearance in the
    column, the reference as each value wrote them) or with a null field (Arrow cannot tell a
    missing key from a null one). `fixed_key_order=True` is the caller's word that every object
    of the column is written with all its keys, in one order (a Kafka Connect struct in its
    schema's field order). A nested column `pyarrow.json` built wrongly (it can drop the nulls that
    open a list, leaving an array that fails validation) is misfits throughout.
    """
    column = one_array(values)
    kind = column.type
    if pa.types.is_null(kind) or not len(column) or column.null_count == len(column):
        return pa.nulls(len(column), pa.string()), np.zeros(len(column), np.bool_)
    if pa.types.is_string(kind):
        return _text(column)
    if pa.types.is_integer(kind):
        return pc.cast(column, pa.string()), np.zeros(len(column), np.bool_)
    if pa.types.is_boolean(kind):
        return pc.if_else(column, "true", "false"), np.zeros(len(column), np.bool_)
    try:
        column.validate(full=True)
    except pa.ArrowInvalid:  # pyarrow.json can lose the nulls that open a list before the list's type is known
        return pa.nulls(len(column), pa.string()), _valid(column)
    if pa.types.is_list(kind) and pa.types.is_string(kind.value_type):
        return string_list_texts(column), np.zeros(len(column), np.bool_)
    try:
        python_values = column.to_pylist()
    except (UnicodeDecodeError, ValueError, pa.ArrowException):  # bytes that are not UTF-8, dates out of range
        return pa.nulls(len(column), pa.string()), _valid(column)
    texts: list[str | None] = []
    misfit = np.zeros(len(column), np.bool_)
    for position, value in enumerate(python_values):
        if value is not None and not _vouched(value, kind, fixed_key_order):
            misfit[position] = True
            value = None
        texts.append(None if value is None else json.dumps(value, separators=_COMPACT))
    return pa.array(texts, pa.string()), misfit


def _vouched(value: Any, kind: pa.DataType, fixed_key_order: bool) -> bool:
    """Whether `json.dumps` of the Python value Arrow gives is the reference's text of the value."""
    if value is None:
        return True
    if pa.types.is_struct(kind):
        fields = list(kind)
        if not fixed_key_order and (len(fields) > 1 or any(value[f.name] is None for f in fields)):
            return False
        return all(_vouched(value[f.name], f.type, fixed_key_order) for f in fields)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return all(_vouched(item, kind.value_type, fixed_key_order) for item in value)
    if pa.types.is_floating(kind):
        return bool(np.isfinite(value)) and not float(value).is_integer()
    return pa.types.is_integer(kind) or pa.types.is_boolean(kind) or pa.types.is_string(kind)


def _valid(column: pa.Array) -> np.ndarray:
    """The non-null positions, as a numpy mask."""
    if column.null_count == 0:
        return np.ones(len(column), np.bool_)
    return column.is_valid().to_numpy(zero_copy_only=False)


def _with_nulls(column: pa.Array, misfit: np.ndarray) -> pa.Array:
    """`column` with the misfit positions null."""
    if not misfit.any():
        return column
    return pc.if_else(pa.array(misfit), pa.scalar(None, column.type), column)


def _validity(mask: np.ndarray) -> pa.Buffer | None:
    """An Arrow validity bitmap of a numpy mask (None when all are valid)."""
    if mask.all():
        return None
    return pa.py_buffer(np.packbits(mask, bitorder="little"))


def _text(column: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Text as it is; values that are not UTF-8 (raw bytes `pyarrow.json` let through) are misfits."""
    try:
        column.validate(full=True)
        return column, np.zeros(len(column), np.bool_)
    except pa.ArrowInvalid:
        pass
    raw = column.cast(pa.binary()).to_pylist()  # rare: locate the bad values one by one
    misfit = np.array([value is not None and not is_utf8(value) for value in raw], np.bool_)
    fixed = pa.array([None if bad or value is None else value.decode() for bad, value in zip(misfit, raw)],
                     pa.string())
    return fixed, misfit


def is_utf8(value: bytes) -> bool:
    """Whether `value` is UTF-8 text."""
    try:
        value.decode()
        return True
    except UnicodeDecodeError:
        return False


def _from_integers(column: pa.Array, type_name: str, target: pa.DataType) -> tuple[pa.Array, np.ndarray]:
    """Integers and epoch-coded dates / timestamps: out of the type's range -> misfit."""
    low, high = INT_RANGES[type_name]
    numbers = pc.fill_null(pc.cast(column, pa.int64()), 0).to_numpy()
    misfit = _valid(column) & ((numbers < low) | (numbers > high))
    numbers = np.where(misfit, 0, numbers)
    if type_name == TypeName.TIMESTAMP_MS:
        numbers = numbers * _US_PER_MS  # in range: no overflow
    elif type_name == TypeName.TIMESTAMP_NS:
        numbers = numbers // _NS_PER_US  # floor, as Python's `//`
    valid = _valid(column) & ~misfit
    storage = numbers.astype(_STORAGE.get(type_name, np.int64))
    return pa.Array.from_buffers(target, len(column), [_validity(valid), pa.py_buffer(storage)]), misfit


def _floats(column: pa.Array, target: pa.DataType) -> tuple[pa.Array, np.ndarray]:
    """Floats (and integers, as Python's `float()`): an infinite value -> misfit (JSON has none: it
    was an integer literal too large for a float, which the reference refuses)."""
    doubles = pc.cast(column, pa.float64(), safe=False)
    misfit = _valid(column) & np.isinf(pc.fill_null(doubles, 0.0).to_numpy())
    return pc.cast(_with_nulls(doubles, misfit), target, safe=False), misfit


def _string_buffers(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets as int64, n + 1 of them, into the data; the data bytes) of a string array."""
    buffers = column.buffers()
    offsets = np.frombuffer(buffers[1], np.int32)[column.offset:column.offset + len(column) + 1].astype(np.int64)
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    return offsets, data


def _decode_base64(column: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Canonical base64 text -> (fits mask, decoded lengths, where each value's first group starts
    in the bytes, how many groups it has, the bytes), for the whole column at once: the values
    whose length is a multiple of four are taken together, so their concatenated text decodes in
    groups of four characters, each two pairs of characters looked up in a 65,536-entry table.
    The bytes are four per group, a zero then the group's three (see `_byte_index`), so a value's
    last one or two may be padding past its length."""
    size = len(column)
    valid = _valid(column)
    offsets, _ = _string_buffers(column)
    candidates = valid & (np.diff(offsets) % 4 == 0)
    chosen = column if candidates.all() else column.filter(pa.array(candidates))
    offsets, data = _string_buffers(chosen)
    groups = np.diff(offsets) // 4
    text = np.ascontiguousarray(data[offsets[0]:offsets[-1]])
    words = _PAIR_CODES[text.view(np.uint16)].view(np.uint32)  # first pair | second pair << 16
    irregular = np.flatnonzero(words & (_FLAGS | _FLAGS << 16))  # padded or bad
    first, second = words[irregular] & 0xFFFF, words[irregular] >> 16
    ends = np.cumsum(groups) - 1  # each value's last group (of the empty ones: the one before)
    last = np.zeros(len(words), np.bool_)
    last[ends[groups > 0]] = True
    bad = ((first > _PAIR_BITS) | ((second & _BAD_PAIR) != 0) | ~last[irregular]
           | (((second & _TWO_PADS) != 0) & ((first & 0b1111) != 0)))
    fits_chosen = np.ones(len(groups), np.bool_)
    if bad.any():
        fits_chosen = np.bincount(np.searchsorted(ends, irregular[bad]), minlength=len(groups)) == 0
    pads = np.zeros(len(words), np.int64)
    pads[irregular] = np.where((second & _TWO_PADS) != 0, 2, np.where((second & _ONE_PAD) != 0, 1, 0))
    lengths_chosen = 3 * groups
    lengths_chosen[groups > 0] -= pads[ends[groups > 0]]
    lengths_chosen[~fits_chosen] = 0
    triples = ((words & _PAIR_BITS) << 12) | ((words >> 16) & _PAIR_BITS)
    decoded = triples.astype(">u4").view(np.uint8)  # big-endian: a zero, then the three bytes
    fits = np.zeros(size, np.bool_)
    fits[candidates] = fits_chosen
    lengths = np.zeros(size, np.int64)
    lengths[candidates] = lengths_chosen
    first_groups, group_counts = np.zeros(size, np.int64), np.zeros(size, np.int64)
    first_groups[candidates] = np.cumsum(groups) - groups
    group_counts[candidates] = groups
    return fits, lengths, first_groups, group_counts, decoded


def _byte_index(first_group: np.ndarray, byte: np.ndarray) -> np.ndarray:
    """Where byte number `byte` of a value whose groups start at `first_group` is in
    `_decode_base64`'s bytes."""
    return 4 * (first_group + byte // 3) + 1 + byte % 3


def _ranks(counts: np.ndarray) -> np.ndarray:
    """0, 1, ... counts[i] - 1 for each i, concatenated."""
    return np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)


def _binary(column: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Base64 text -> bytes (`b64decode(validate=True)`), non-canonical base64 a misfit."""
    fits, lengths, first_groups, groups, data = _decode_base64(column)
    keep = np.ones(len(data), np.bool_)
    keep[::4] = False  # each group's leading zero
    dropped = 3 * groups - lengths  # padding bytes, or all of a misfit's
    if dropped.any():
        keep[_byte_index(np.repeat(first_groups, dropped), np.repeat(lengths, dropped) + _ranks(dropped))] = False
    data = data[keep]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    array = pa.Array.from_buffers(pa.binary(), len(column), [_validity(fits), pa.py_buffer(offsets),
                                                             pa.py_buffer(data)])
    return array, _valid(column) & ~fits


def _decimal(column: pa.Array, target: pa.DataType) -> tuple[pa.Array, np.ndarray]:
    """Base64 of a big-endian two's-complement unscaled integer -> decimal: the bytes are laid out
    little-endian in 16 (32) bytes per value with sign extension, then held to the precision."""
    size = len(column)
    valid = _valid(column)
    if not 0 <= target.scale <= target.precision:  # Arrow's precision rules differ there
        return pa.nulls(size, target), valid
    wide = target.precision > MAX_DECIMAL128_PRECISION
    width = 32 if wide else 16
    fits, lengths, first_groups, _, data = _decode_base64(column)
    fits &= lengths <= width
    lengths = np.where(fits, lengths, 0)
    data = np.append(data, np.uint8(0))  # a byte to read for values without any
    negative = (lengths > 0) & (data[np.where(lengths > 0, 4 * first_groups + 1, -1)] >= 0x80)
    fill = np.where(negative, np.uint8(0xFF), np.uint8(0))
    storage = np.empty((size, width), np.uint8)
    at = _byte_index(first_groups, lengths - 1)  # each value's last (least significant) byte
    for position in range(width):  # little-endian: byte `position` is the value's one `position` from the end
        present = position < lengths
        storage[:, position] = np.where(present, data[np.where(present, at, -1)], fill)
        at -= 1 + ((at & 3) == 1)  # the byte before, skipping a group's leading zero
    whole = pa.decimal256(76, 0) if wide else pa.decimal128(38, 0)
    unscaled = pa.Array.from_buffers(whole, size, [None, pa.py_buffer(storage)])
    bound = 10 ** target.precision - 1
    in_precision = pc.and_(pc.greater_equal(unscaled, _unscaled(-bound, whole, width)),
                           pc.less_equal(unscaled, _unscaled(bound, whole, width)))
    fits &= in_precision.to_numpy(zero_copy_only=False)
    storage[~fits] = 0
    array = pa.Array.from_buffers(target, size, [_validity(fits), pa.py_buffer(storage)])
    return array, valid & ~fits


def _unscaled(number: int, whole: pa.DataType, width: int) -> pa.Scalar:
    """A scale-0 decimal scalar from its bytes (`pa.scalar` cannot make 38-digit ones)."""
    raw = pa.py_buffer(number.to_bytes(width, "little", signed=True))
    return pa.Array.from_buffers(whole, 1, [None, raw])[0]


def _iso_dates(column: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """`YYYY-MM-DD` text -> date32 (`date.fromisoformat`)."""
    text = _IsoText(column)
    date = text.digits(0, _DATE_LENGTH)
    year, month, day = _number(date[:, 0:4]), _number(date[:, 5:7]), _number(date[:, 8:10])
    ok = (text.lengths == _DATE_LENGTH) & _laid_out(date, _DATE_LAYOUT) & _valid_date(year, month, day)
    return text.result(pa.date32(), ok, np.where(ok, _days_from_civil(year, month, day), 0).astype(np.int32))


def _iso_timestamps(column: pa.Array, target: pa.DataType, zoned: bool) -> tuple[pa.Array, np.ndarray]:
    """ISO date-time text -> microseconds: the fraction cut (not rounded) to six digits; an offset
    converted to UTC when `zoned` (ZonedTimestamp), else dropped (`replace(tzinfo=None)`); no
    offset is UTC. As `arrow_types._parse_iso` and `_epoch_us` do. Fractions of up to nine digits
    (Java's nanoseconds) are read; longer ones are misfits."""
    text = _IsoText(column)
    lengths = text.lengths
    moment = text.digits(0, _DATE_TIME_LENGTH)
    zone = text.digits_from_end(_OFFSET_LENGTH)
    utc = zone[:, -1] == _code("Z")
    signed = (((zone[:, 0] == _code("+")) | (zone[:, 0] == _code("-")))
              & (lengths >= _DATE_TIME_LENGTH + _OFFSET_LENGTH) & _laid_out(zone, _OFFSET_LAYOUT))
    fraction_length = lengths - np.where(utc, 1, np.where(signed, _OFFSET_LENGTH, 0)) - _DATE_TIME_LENGTH - 1
    dotted = fraction_length >= 0  # -1: no fraction, not even a dot
    fraction = text.digits(_DATE_TIME_LENGTH, 1 + _MAX_FRACTION_DIGITS)
    counted = np.arange(_MAX_FRACTION_DIGITS) < fraction_length[:, None]
    ok = ((lengths >= _DATE_TIME_LENGTH) & _laid_out(moment, _DATE_TIME_LAYOUT)
          & ((fraction_length == -1) | ((fraction_length >= 1) & (fraction_length <= _MAX_FRACTION_DIGITS)))
          & (~dotted | (fraction[:, 0] == _code("."))) & np.all((fraction[:, 1:] < 10) | ~counted, axis=1))
    year, month, day = _number(moment[:, 0:4]), _number(moment[:, 5:7]), _number(moment[:, 8:10])
    hour, minute, second = _number(moment[:, 11:13]), _number(moment[:, 14:16]), _number(moment[:, 17:19])
    offset_hours, offset_minutes = _number(zone[:, 1:3]), _number(zone[:, 4:6])
    ok &= _valid_date(year, month, day) & (hour <= 23) & (minute <= 59) & (second <= 59)
    ok &= ~signed | ((offset_hours <= 23) & (offset_minutes <= 59))  # Python parses even a dropped offset
    micros = (_days_from_civil(year, month, day) * _US_PER_DAY + ((hour * 60 + minute) * 60 + second) * _US_PER_SECOND
              + _number(np.where(counted, fraction[:, 1:], 0)[:, :_FRACTION_DIGITS]))
    if zoned:
        direction = np.where(zone[:, 0] == _code("-"), -1, 1)
        micros -= np.where(signed, direction * (offset_hours * 60 + offset_minutes) * 60 * _US_PER_SECOND, 0)
    return text.result(target, ok, np.where(ok, micros, 0))


class _IsoText:
    """The non-null values of a text column, for reading characters at fixed positions from each
    value's start or end, as digit values (the character minus `0`: 0..9 for a digit). The data
    is padded so that reads past a value stay in bounds; callers mask those."""

    def __init__(self, column: pa.Array) -> None:
        self.column = column
        self.valid = _valid(column)
        self.chosen = column if self.valid.all() else column.filter(pa.array(self.valid))
        offsets, data = _string_buffers(self.chosen)
        self.starts = offsets[:-1] - offsets[0]
        self.lengths = np.diff(offsets)
        self.data = np.concatenate([data[offsets[0]:offsets[-1]], np.zeros(_READ_AHEAD, np.uint8)]) - np.uint8(
            ord("0"))

    def digits(self, position: int, width: int) -> np.ndarray:
        """The `width` characters from `position` of each value (a row each)."""
        return self.data[self.starts[:, None] + np.arange(position, position + width)]

    def digits_from_end(self, width: int) -> np.ndarray:
        """The last `width` characters of each value (of shorter ones: from the start)."""
        return self.data[(self.starts + np.maximum(self.lengths - width, 0))[:, None] + np.arange(width)]

    def result(self, target: pa.DataType, ok: np.ndarray, values: np.ndarray) -> tuple[pa.Array, np.ndarray]:
        """The typed column (the fitting values, nulls elsewhere) and the misfit mask."""
        fits = np.zeros(len(self.column), np.bool_)
        fits[self.valid] = ok
        storage = np.zeros(len(self.column), values.dtype)
        storage[self.valid] = values
        array = pa.Array.from_buffers(target, len(self.column), [_validity(fits), pa.py_buffer(storage)])
        return array, self.valid & ~fits


def _code(character: str) -> int:
    """A character as `_IsoText` reads it (its byte minus `0`, modulo 256)."""
    return (ord(character) - ord("0")) % 256


def _layout(pattern: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(where a digit goes, where any character goes, the character everywhere else) of a pattern:
    `d` a digit, `?` anything."""
    digit = np.array([character == "d" for character in pattern])
    anything = np.array([character == "?" for character in pattern])
    return digit, anything, np.array([_code(character) for character in pattern], np.uint8)


_DATE_LAYOUT = _layout("dddd-dd-dd")
_DATE_TIME_LAYOUT = _layout("dddd-dd-ddTdd:dd:dd")
_OFFSET_LAYOUT = _layout("?dd:dd")  # the sign is checked apart


def _laid_out(characters: np.ndarray, layout: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """Whether each row of characters (as `_IsoText` reads them) follows the layout."""
    digit, anything, codes = layout
    return np.all(np.where(digit, characters < 10, anything | (characters == codes)), axis=1)


def _number(digits: np.ndarray) -> np.ndarray:
    """The decimal number each row of digit values writes."""
    number = np.zeros(len(digits), np.int64)
    for column in range(digits.shape[1]):
        number = number * 10 + digits[:, column]
    return number


def _valid_date(year: np.ndarray, month: np.ndarray, day: np.ndarray) -> np.ndarray:
    """Whether year, month and day make a date; year 0 does not (Python's dates start at year 1)."""
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    month_ok = (month >= 1) & (month <= 12)
    days_in_month = _DAYS_IN_MONTH[np.where(month_ok, month, 0)] + (leap & (month == 2))
    return (year >= 1) & month_ok & (day >= 1) & (day <= days_in_month)


def _days_from_civil(year: np.ndarray, month: np.ndarray, day: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 of proleptic Gregorian dates (H. Hinnant's `days_from_civil`)."""
    year = year - (month <= 2)
    era = np.floor_divide(year, 400)
    year_of_era = year - era * 400
    day_of_year = (153 * np.where(month > 2, month - 3, month + 9) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146_097 + day_of_era - 719_468
