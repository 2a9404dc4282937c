"""Vectorised value conversion (`bulk_values`) against the reference (`arrow_types.typed_column`).

Each property writes generated JSON values as NDJSON `{"c": value}` lines, parses them with
`pyarrow.json` as `parse_type` says, converts the column with `bulk_column` and holds every
position to `typed_column` of that one value: a non-misfit equals it, a value the reference
refuses is a misfit, a misfit is null, a null stays a null. Debezium-shaped valid values are
never misfits. Examples are derandomised (deterministic runs).
"""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pyarrow.json as pj
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.delta.arrow_types import TypeName, arrow_type, typed_column
from service.kafka_to_delta.formats.bulk_values import bulk_column, json_text, parse_type
from service.kafka_to_delta.formats.row_fit import INT_RANGES

REFUSED = object()
EXAMPLES = settings(max_examples=120, derandomize=True, deadline=None)
FEW_EXAMPLES = settings(max_examples=40, derandomize=True, deadline=None)  # per type of a parametrised family
INT64 = (-(2**63), 2**63 - 1)
EDGES = sorted({bound + step for low, high in INT_RANGES.values() for bound in (low, high) for step in (-1, 0, 1)
                if INT64[0] <= bound + step <= INT64[1]})
BASE64_CHARACTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
STRING_LOGICAL = ("io.debezium.data.Json", "io.debezium.data.Uuid", "io.debezium.data.Enum",
                  "io.debezium.data.EnumSet", "io.debezium.data.Xml", "io.debezium.time.ZonedTime")
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)  # JSON cannot carry lone surrogates


def parsed(values: list, data_type: pa.DataType | None) -> pa.ChunkedArray:
    """The values as `pyarrow.json` parses NDJSON `{"c": value}` lines (explicit type, or inferred)."""
    text = "".join(json.dumps({"c": value}) + "\n" for value in values).encode()
    schema = None if data_type is None else pa.schema([("c", data_type)])
    options = pj.ParseOptions(explicit_schema=schema)
    return pj.read_json(pa.py_buffer(text), parse_options=options).column("c")


def reference(type_name: str, value: object) -> pa.Array | object:
    """`typed_column` of one value, or REFUSED."""
    try:
        return typed_column("c", type_name, [value])
    except ValueError:
        return REFUSED


def check(values: list, type_name: str, data_type: pa.DataType | None = None, nested: bool = False,
          shaped: bool = False) -> np.ndarray:
    """Parse, convert and hold each position to the reference; returns the misfit mask."""
    column = parsed(values, data_type if data_type is not None else parse_type(type_name, nested))
    typed, misfit = bulk_column(column, type_name)
    assert typed.type == arrow_type(type_name) and len(typed) == len(values) == len(misfit)
    for position, value in enumerate(values):
        expected = reference(type_name, value)
        if value is None:
            assert not misfit[position] and not typed[position].is_valid
        elif expected is REFUSED:
            assert misfit[position], f"refused value at {position} not a misfit"
        if misfit[position]:
            assert not typed[position].is_valid
        elif expected is not REFUSED:
            assert typed.slice(position, 1).equals(expected), (position, typed[position], expected)
    if shaped:
        assert not misfit.any(), f"{int(misfit.sum())} Debezium-shaped values are misfits"
    return misfit


def with_nulls(values: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(st.one_of(st.none(), values), min_size=1, max_size=30)


# -- integers, floats, booleans, text ------------------------------------------------------------

INTEGER_CODED = [*TypeName.INTEGERS, TypeName.DATE32, TypeName.TIMESTAMP_MS, TypeName.TIMESTAMP_US,
                 TypeName.TIMESTAMP_NS, TypeName.TIMESTAMP_US_UTC]


@pytest.mark.parametrize("type_name", INTEGER_CODED)
@FEW_EXAMPLES
@given(values=with_nulls(st.one_of(st.integers(*INT64), st.sampled_from(EDGES), st.integers(-(10**6), 10**6))))
def test_integer_coded_values_match_the_reference(type_name, values):
    check(values, type_name, data_type=pa.int64())


@pytest.mark.parametrize("type_name", INTEGER_CODED)
@FEW_EXAMPLES
@given(data=st.data())
def test_integer_coded_values_in_range_are_never_misfits(type_name, data):
    low, high = INT_RANGES[type_name]
    check(data.draw(with_nulls(st.integers(low, high))), type_name, data_type=pa.int64(), shaped=True)


def test_integers_beyond_64_bits_make_pyarrow_json_refuse_the_range():
    """Such a range is not converted at all: the caller decodes it record by record."""
    with pytest.raises(pa.ArrowInvalid):
        parsed([1, 2**63], parse_type(TypeName.INT64))


@pytest.mark.parametrize("type_name", TypeName.FLOATS)
@EXAMPLES
@given(values=with_nulls(st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2**70), 2**70),
                            st.integers(2**1020, 2**1030), st.sampled_from([3.4028235e38, 3.4028236e38, -0.0]))))
def test_floats_match_the_reference(type_name, values):
    check(values, type_name)


@pytest.mark.parametrize("type_name", TypeName.FLOATS)
@FEW_EXAMPLES
@given(values=with_nulls(st.floats(allow_nan=False, allow_infinity=False, width=32)))
def test_debezium_floats_are_never_misfits(type_name, values):
    check(values, type_name, shaped=True)


@EXAMPLES
@given(with_nulls(st.booleans()))
def test_booleans_match_the_reference(values):
    check(values, TypeName.BOOL, shaped=True)


@EXAMPLES
@given(with_nulls(st.one_of(TEXT, st.uuids().map(str), st.sampled_from(["<a/>", '{"k":[1,2]}', "10:15:30Z",
                                                                        "2024-03-01T10:15:30Z"]))))
def test_text_and_string_logical_types_stay_as_they_are(values):
    check(values, TypeName.STRING, shaped=True)


def test_string_logical_types_are_parsed_as_text():
    from connectors.delta.connect_types import CONNECT_LOGICAL

    assert {parse_type(CONNECT_LOGICAL[name]) for name in STRING_LOGICAL} == {pa.string()}


def test_text_that_is_not_utf8_is_a_misfit():
    column = pj.read_json(pa.py_buffer(b'{"c":"ok"}\n{"c":"\xff"}\n{"c":null}\n'),
                          parse_options=pj.ParseOptions(explicit_schema=pa.schema([("c", pa.string())]))).column("c")
    typed, misfit = bulk_column(column, TypeName.STRING)
    assert misfit.tolist() == [False, True, False] and typed.to_pylist() == ["ok", None, None]


# -- base64: bytes and decimals ------------------------------------------------------------------

def base64_noise() -> st.SearchStrategy:
    """Text that is often almost base64: wrong lengths, padding in odd places, other characters,
    unused bits set."""
    almost = st.text(st.sampled_from(BASE64_CHARACTERS + "=-_ \n\u00e9"), max_size=14)
    unused_bits = st.binary(min_size=1, max_size=8).map(lambda raw: _set_unused_bits(base64.b64encode(raw).decode()))
    return st.one_of(almost, unused_bits, st.sampled_from(["", "====", "A===", "AB==", "AAAA====", "AA=A"]))


def _set_unused_bits(text: str) -> str:
    if not text.endswith("="):
        return text
    last = text.rstrip("=")[-1]
    return text.rstrip("=")[:-1] + BASE64_CHARACTERS[BASE64_CHARACTERS.index(last) | 1] + text[len(text.rstrip("=")):]


def encoded(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@EXAMPLES
@given(with_nulls(st.one_of(st.binary(max_size=20).map(encoded), base64_noise())))
def test_bytes_match_the_reference(values):
    check(values, TypeName.BINARY)


@EXAMPLES
@given(with_nulls(st.binary(max_size=40).map(encoded)))
def test_debezium_bytes_are_never_misfits(values):
    check(values, TypeName.BINARY, shaped=True)


def unscaled_bytes(unscaled: int) -> bytes:
    """Java's BigInteger.toByteArray: the shortest big-endian two's complement."""
    return unscaled.to_bytes(unscaled.bit_length() // 8 + 1, "big", signed=True)


DECIMALS = st.one_of(st.integers(1, 76).flatmap(lambda p: st.tuples(st.just(p), st.integers(0, p))),
                     st.sampled_from([(38, 0), (38, 38), (39, 2), (76, 10), (10, -2), (5, 7), (18, 4)]))


@EXAMPLES
@given(DECIMALS, st.data())
def test_decimals_match_the_reference(precision_scale, data):
    precision, scale = precision_scale
    numbers = st.one_of(st.integers(-(10**precision), 10**precision), st.integers(-(2**260), 2**260),
                        st.sampled_from([0, -1, 2**127 - 1, -(2**127), 2**127, 10**38 - 1, -(10**38)]))
    values = data.draw(with_nulls(st.one_of(numbers.map(lambda n: encoded(unscaled_bytes(n))),
                                            st.binary(max_size=34).map(encoded), base64_noise())))
    check(values, f"decimal({precision},{scale})")


@EXAMPLES
@given(st.integers(1, 76).flatmap(lambda p: st.tuples(st.just(p), st.integers(0, p))), st.data())
def test_debezium_decimals_are_never_misfits(precision_scale, data):
    precision, scale = precision_scale
    bound = 10**precision - 1
    values = data.draw(with_nulls(st.one_of(st.integers(-bound, bound), st.sampled_from([bound, -bound, 0, -1])).map(
        lambda n: encoded(unscaled_bytes(n)))))
    check(values, f"decimal({precision},{scale})", shaped=True)


# -- dates and timestamps as text ----------------------------------------------------------------

def iso_text(zones: st.SearchStrategy) -> st.SearchStrategy:
    """ISO date-times, often invalid: day 31 of short months, Feb 29 of any year, hour 24, second
    60, year 0, up to 12 fraction digits, odd offsets."""
    return st.builds(
        lambda y, mo, d, h, mi, s, fraction, zone, separator: (
            f"{y:04d}-{mo:02d}-{d:02d}{separator}{h:02d}:{mi:02d}:{s:02d}{fraction}{zone}"),
        st.one_of(st.integers(0, 9999), st.sampled_from([1, 1900, 1969, 1970, 2000, 2023, 2024, 2100, 9999])),
        st.integers(0, 13), st.integers(0, 32), st.integers(0, 24), st.integers(0, 60), st.integers(0, 60),
        st.one_of(st.just(""), st.text("0123456789", min_size=0, max_size=12).map(lambda digits: "." + digits)),
        zones, st.sampled_from(["T", "T", "T", " ", "t"]))


ODD_ZONES = st.one_of(st.sampled_from(["", "Z", "z", "+00:00", "-00:00", "+0200", "+02", "+24:00", "+23:59",
                                       "-12:30", "+05:30:15", "UTC", " Z"]),
                      st.builds(lambda sign, h, m: f"{sign}{h:02d}:{m:02d}", st.sampled_from("+-"),
                                st.integers(0, 25), st.integers(0, 61)))


def debezium_zoned(moment: datetime, offset_minutes: int) -> str:
    """Debezium's ZonedTimestamp text (ISO_OFFSET_DATE_TIME: fraction without trailing zeros)."""
    local = moment.astimezone(timezone(timedelta(minutes=offset_minutes)))
    text = (f"{local.year:04d}-{local.month:02d}-{local.day:02d}"
            f"T{local.hour:02d}:{local.minute:02d}:{local.second:02d}")
    if local.microsecond:
        text += "." + f"{local.microsecond:06d}".rstrip("0")
    if offset_minutes == 0:
        return text + "Z"
    sign, minutes = ("+" if offset_minutes > 0 else "-"), abs(offset_minutes)
    return f"{text}{sign}{minutes // 60:02d}:{minutes % 60:02d}"


ZONED = st.builds(debezium_zoned, st.datetimes(datetime(1, 1, 2), datetime(9999, 12, 30), timezones=st.just(timezone.utc)),
                  st.sampled_from([0, 0, 60, -300, 330, 840, -720]))


@pytest.mark.parametrize("type_name", [TypeName.TIMESTAMP_US_UTC, TypeName.TIMESTAMP_MS, TypeName.TIMESTAMP_US,
                                       TypeName.TIMESTAMP_NS])
@EXAMPLES
@given(values=with_nulls(st.one_of(iso_text(ODD_ZONES), ZONED, TEXT, st.sampled_from(["2024-03-01", "2024-02-29T10:15:30Z"]))))
def test_iso_timestamps_match_the_reference(type_name, values):
    check(values, type_name, data_type=pa.string())


@EXAMPLES
@given(with_nulls(ZONED))
def test_debezium_zoned_timestamps_are_never_misfits(values):
    check(values, TypeName.TIMESTAMP_US_UTC, shaped=True)


@EXAMPLES
@given(with_nulls(st.one_of(
    st.builds(lambda y, m, d: f"{y:04d}-{m:02d}-{d:02d}", st.integers(0, 9999), st.integers(0, 13),
              st.integers(0, 32)),
    st.dates().map(lambda day: day.isoformat()), TEXT, st.sampled_from(["20240301", "2024-W01-1", "2024-3-1"]))))
def test_iso_dates_match_the_reference(values):
    check(values, TypeName.DATE32, data_type=pa.string())


@EXAMPLES
@given(with_nulls(st.dates().map(lambda day: day.isoformat())))
def test_iso_dates_of_valid_days_are_never_misfits(values):
    check(values, TypeName.DATE32, data_type=pa.string(), shaped=True)


# -- nested values as JSON text ------------------------------------------------------------------

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**62), 2**62),
                    st.floats(allow_nan=False, allow_infinity=False), TEXT,
                    st.sampled_from(["2024-03-01", "2024-03-01T10:15:30Z", "é"]))
NAMES = st.sampled_from(["a", "b", "c"])


def connect_struct(fields: list[tuple[str, st.SearchStrategy]]) -> st.SearchStrategy:
    """A Kafka Connect struct value: every field, in schema order, some null."""
    return st.tuples(*(st.one_of(st.none(), kind) for _, kind in fields)).map(
        lambda values: {name: value for (name, _), value in zip(fields, values)})


FIELD_KINDS = st.sampled_from([st.integers(-(2**40), 2**40), st.booleans(), TEXT,
                               st.floats(allow_nan=False, allow_infinity=False),
                               st.lists(st.integers(-5, 5), max_size=3)])


@EXAMPLES
@given(st.lists(st.tuples(NAMES, FIELD_KINDS), min_size=0, max_size=3, unique_by=lambda f: f[0]), st.data())
def test_connect_structs_as_json_text_match_the_reference(fields, data):
    values = data.draw(with_nulls(connect_struct(fields)))
    column = parsed(values, parse_type(TypeName.STRING, nested=True))
    for fixed_key_order in (False, True):
        text, misfit = json_text(column, fixed_key_order=fixed_key_order)
        assert_text(values, text, misfit)


@EXAMPLES
@given(with_nulls(st.one_of(
    st.dictionaries(NAMES, st.integers(-9, 9), max_size=3), st.dictionaries(NAMES, st.none(), max_size=2))))
def test_objects_of_any_key_order_as_json_text_are_exact_or_misfits(values):
    text, misfit = json_text(parsed(values, None))
    assert_text(values, text, misfit)


@EXAMPLES
@given(st.sampled_from([st.lists(st.integers(-9, 9), max_size=4), st.lists(st.floats(allow_nan=False), max_size=3),
                        st.lists(TEXT, max_size=3), st.floats(allow_nan=False, allow_infinity=False),
                        st.integers(-(2**62), 2**62), st.booleans(), SCALARS.filter(lambda v: isinstance(v, str))]),
       st.data())
def test_arrays_and_scalars_as_json_text_match_the_reference(kind, data):
    values = data.draw(with_nulls(kind))
    typed, misfit = bulk_column(parsed(values, None), TypeName.STRING)
    assert_text(values, typed, misfit)


WORDS = st.one_of(st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=6),  # quotes, backslashes
                  st.text(max_size=6))  # any text: control characters, non-ASCII


@EXAMPLES
@given(with_nulls(st.lists(st.one_of(st.none(), WORDS), max_size=4)), st.integers(0, 3))
def test_lists_of_words_match_the_reference(values, cut):
    """A text[] column of any words: equal to the reference, sliced arrays included, and never a misfit."""
    column = parsed(values, None)
    text, misfit = json_text(column.slice(min(cut, len(values))))
    assert_text(values[min(cut, len(values)):], text, misfit)
    if any(word is not None for value in values if value for word in value):
        try:
            column.chunk(0).validate(full=True)
        except pa.ArrowInvalid:
            return  # built wrongly by pyarrow.json: misfits (test_a_list_column_pyarrow_built_wrongly_is_misfits)
        assert not misfit.any()


def test_only_the_words_json_escapes_are_written_one_at_a_time(monkeypatch):
    column = parsed([["a", "b c"], None, [], ["x", None, "größe"], ["2024-03-01 words", 'say "hi"']], None)
    written = []
    dumps = json.dumps
    monkeypatch.setattr(json, "dumps", lambda value, *args, **kwargs: written.append(value) or dumps(value))
    text, misfit = json_text(column)
    assert text.to_pylist() == ['["a","b c"]', None, "[]", '["x",null,"gr\\u00f6\\u00dfe"]',
                                '["2024-03-01 words","say \\"hi\\""]']
    assert written == ["größe", 'say "hi"'] and not misfit.any()


def test_a_list_column_pyarrow_built_wrongly_is_misfits():
    """`pyarrow.json` drops the null opening the first list when no earlier value told it the item type
    (the array fails validation; reading it crashes the interpreter's string building)."""
    column = parsed([[None, "x"], ["y"], None], None)
    with pytest.raises(pa.ArrowInvalid):
        column.chunk(0).validate(full=True)
    text, misfit = json_text(column)
    assert misfit.tolist() == [True, True, False] and text.null_count == 3


def test_timestamp_like_and_integral_float_fields_are_misfits():
    values = [{"a": "2024-03-01"}, {"a": "2024-03-02"}, {"x": 1.5}]
    text, misfit = json_text(parsed(values, None))
    assert misfit.tolist() == [True, True, True]
    values = [[1, 2.5], [2.25], [3.0]]
    text, misfit = json_text(parsed(values, None))
    assert misfit.tolist() == [True, False, True] and text[1].as_py() == "[2.25]"


def assert_text(values: list, text: pa.Array, misfit: np.ndarray) -> None:
    for position, value in enumerate(values):
        expected = reference(TypeName.STRING, value)
        if value is None:
            assert not misfit[position] and not text[position].is_valid
        elif misfit[position]:
            assert not text[position].is_valid
        else:
            assert expected is not REFUSED and text[position].as_py() == expected[0].as_py(), position


@pytest.mark.parametrize("type_name", [*TypeName.INTEGERS, *TypeName.FLOATS, TypeName.BOOL, TypeName.STRING,
                                       TypeName.BINARY, TypeName.DATE32, TypeName.TIMESTAMP_MS,
                                       TypeName.TIMESTAMP_US_UTC, "decimal(10,2)", "decimal(40,2)"])
def test_empty_all_null_sliced_and_chunked_columns(type_name):
    values = {TypeName.BINARY: "AQI=", TypeName.TIMESTAMP_US_UTC: "2024-02-29T23:59:59.999999-01:00",
              "decimal(10,2)": "AQI=", "decimal(40,2)": "/w==", TypeName.BOOL: True, TypeName.STRING: "é",
              TypeName.FLOAT32: 1.5, TypeName.FLOAT64: 1.5}.get(type_name, 7)
    data_type = parse_type(type_name)
    for column in (pa.array([], data_type), pa.nulls(3, data_type), pa.chunked_array([], data_type)):
        typed, misfit = bulk_column(column, type_name)
        assert typed.type == arrow_type(type_name) and typed.null_count == len(typed) == len(column)
        assert not misfit.any()
    whole = pa.array([values, None, values, values], data_type)
    expected = typed_column("c", type_name, [values, None, values, values])
    for column in (whole.slice(1, 3), pa.chunked_array([whole.slice(0, 1), whole.slice(1, 3)])):
        typed, misfit = bulk_column(column, type_name)
        assert typed.equals(expected.slice(len(whole) - len(column))) and not misfit.any()
