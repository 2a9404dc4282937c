"""Arrow column types: Connect schemas, inference, merging, typed tables from JSON rows."""

from __future__ import annotations

import base64
import json
import random
from datetime import date, datetime, timezone
from decimal import Decimal

import pyarrow as pa
import pytest

from connectors.delta.arrow_types import (
    arrow_type,
    binary_array,
    infer_types,
    merge_types,
    rows_to_table,
    string_list_texts,
)
from connectors.delta.connect_types import connect_schema_to_types
from tests.support.run_seed import run_seed

SECRET = "s3cr3t-personal-data"
DECIMAL = "org.apache.kafka.connect.data.Decimal"


def field(name: str, type_: str, logical: str | None = None, **extra) -> dict:
    spec = {"type": type_, "optional": True, "field": name, **extra}
    if logical:
        spec["name"] = logical
    return spec


def envelope_schema(fields: list[dict], image: str = "after") -> dict:
    row = {"type": "struct", "optional": True, "name": "db.t.Value", "fields": fields}
    return {
        "type": "struct",
        "name": "db.t.Envelope",
        "fields": [
            {**row, "field": image},
            {"type": "struct", "fields": [], "field": "source"},
            {"type": "string", "field": "op"},
            {"type": "int64", "field": "ts_ms"},
        ],
    }


def decimal_bytes(unscaled: int) -> str:
    length = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


# --- Connect schemas -------------------------------------------------------------------

MAPPINGS = [
    (field("a", "int8"), "int8"),
    (field("a", "int16"), "int16"),
    (field("a", "int32"), "int32"),
    (field("a", "int64"), "int64"),
    (field("a", "float32"), "float32"),
    (field("a", "float64"), "float64"),
    (field("a", "float"), "float64"),
    (field("a", "boolean"), "bool"),
    (field("a", "string"), "string"),
    (field("a", "bytes"), "binary"),
    (field("a", "int32", "io.debezium.time.Date"), "date32"),
    (field("a", "int32", "org.apache.kafka.connect.data.Date"), "date32"),
    (field("a", "int64", "io.debezium.time.MicroTimestamp"), "timestamp_us"),
    (field("a", "int64", "io.debezium.time.Timestamp"), "timestamp_ms"),
    (field("a", "int64", "org.apache.kafka.connect.data.Timestamp"), "timestamp_ms"),
    (field("a", "int64", "io.debezium.time.NanoTimestamp"), "timestamp_ns"),
    (field("a", "string", "io.debezium.time.ZonedTimestamp"), "timestamp_us_utc"),
    (field("a", "int64", "io.debezium.time.MicroTime"), "int64"),
    (field("a", "int32", "io.debezium.time.Time"), "int64"),
    (
        field(
            "a",
            "bytes",
            "org.apache.kafka.connect.data.Decimal",
            parameters={"scale": "2", "connect.decimal.precision": "10"},
        ),
        "decimal(10,2)",
    ),
    (
        field("a", "bytes", "org.apache.kafka.connect.data.Decimal", parameters={"scale": "3"}),
        "decimal(38,3)",
    ),
    (field("a", "struct", "io.debezium.data.VariableScaleDecimal"), "string"),
    (field("a", "string", "io.debezium.data.Json"), "string"),
    (field("a", "string", "io.debezium.data.Uuid"), "string"),
    (field("a", "string", "io.debezium.data.Enum"), "string"),
    (field("a", "struct", fields=[field("x", "int32")]), "string"),
    (field("a", "array", items={"type": "int32"}), "string"),
    (field("a", "map", keys={"type": "string"}, values={"type": "string"}), "string"),
]


@pytest.mark.parametrize(("spec", "expected"), MAPPINGS)
def test_connect_field_types(spec, expected):
    assert connect_schema_to_types(envelope_schema([spec])) == {"a": expected}
    assert arrow_type(expected) is not None


def test_schema_keeps_field_order_and_falls_back_to_before():
    fields = [field("z", "int64", optional=False), field("a", "string")]
    assert list(connect_schema_to_types(envelope_schema(fields))) == ["z", "a"]
    assert connect_schema_to_types(envelope_schema(fields, image="before")) == {
        "z": "int64",
        "a": "string",
    }


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string"},
        {"type": "struct"},
        {"type": "struct", "fields": [{"type": "string", "field": "op"}]},
        envelope_schema([{"type": "int32"}]),
        envelope_schema([field("a", "no-such-type")]),
        envelope_schema([field("a", "bytes", DECIMAL, parameters={"scale": "x"})]),
    ],
)
def test_unusable_schemas_raise_value_error(schema):
    with pytest.raises(ValueError):
        connect_schema_to_types(schema)


# --- arrow types -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("int8", pa.int8()),
        ("bool", pa.bool_()),
        ("binary", pa.binary()),
        ("date32", pa.date32()),
        ("timestamp_ms", pa.timestamp("us")),
        ("timestamp_ns", pa.timestamp("us")),
        ("timestamp_us_utc", pa.timestamp("us", tz="UTC")),
        ("decimal(10,2)", pa.decimal128(10, 2)),
        ("decimal(40,2)", pa.decimal256(40, 2)),
    ],
)
def test_arrow_type(name, expected):
    assert arrow_type(name) == expected


@pytest.mark.parametrize("name", ["decimal", "decimal(1)", "uint8", ""])
def test_unknown_arrow_type(name):
    with pytest.raises(ValueError, match="unknown column type"):
        arrow_type(name)


# --- tables ----------------------------------------------------------------------------


def test_rows_to_table_converts_every_type():
    types = {
        "i8": "int8",
        "i": "int64",
        "f": "float64",
        "b": "bool",
        "s": "string",
        "nested": "string",
        "bin": "binary",
        "d": "date32",
        "ts_ms": "timestamp_ms",
        "ts_us": "timestamp_us",
        "ts_ns": "timestamp_ns",
        "zoned": "timestamp_us_utc",
        "price": "decimal(10,2)",
        "missing": "int32",
    }
    row = {
        "i8": -3,
        "i": 2**40,
        "f": 1,
        "b": True,
        "s": "x",
        "nested": {"k": [1, 2]},
        "bin": base64.b64encode(b"\x00\xff").decode(),
        "d": 19724,
        "ts_ms": 1_700_000_000_123,
        "ts_us": 1_700_000_000_123_456,
        "ts_ns": 1_700_000_000_123_456_789,
        "zoned": "2024-01-02T03:04:05.123456Z",
        "price": decimal_bytes(-12345),
        "ignored": "not in types",
    }
    table = rows_to_table([row, None], types)
    assert table.column_names == list(types)
    assert [f.type for f in table.schema] == [arrow_type(t) for t in types.values()]
    first, second = table.to_pylist()
    assert set(second.values()) == {None}
    naive = datetime(2023, 11, 14, 22, 13, 20, 123000)
    assert first == {
        "i8": -3,
        "i": 2**40,
        "f": 1.0,
        "b": True,
        "s": "x",
        "nested": '{"k":[1,2]}',
        "bin": b"\x00\xff",
        "d": date(2024, 1, 2),
        "ts_ms": naive,
        "ts_us": naive.replace(microsecond=123456),
        "ts_ns": naive.replace(microsecond=123456),
        "zoned": datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc),
        "price": Decimal("-123.45"),
        "missing": None,
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-01-02T03:04:05Z", datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc)),
        ("2024-01-02T03:04:05.1Z", datetime(2024, 1, 2, 3, 4, 5, 100000, tzinfo=timezone.utc)),
        ("2024-01-02T03:04:05.123456789Z", datetime(2024, 1, 2, 3, 4, 5, 123456, timezone.utc)),
        ("2024-01-02T05:04:05+02:00", datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc)),
        ("1969-12-31T23:59:59.5Z", datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=timezone.utc)),
    ],
)
def test_zoned_timestamps_round_trip(text, expected):
    table = rows_to_table([{"t": text}], {"t": "timestamp_us_utc"})
    assert table.column("t").to_pylist() == [expected]


@pytest.mark.parametrize(
    ("unscaled", "type_name", "expected"),
    [
        (0, "decimal(5,2)", Decimal("0.00")),
        (1, "decimal(5,2)", Decimal("0.01")),
        (-1, "decimal(5,2)", Decimal("-0.01")),
        (128, "decimal(5,0)", Decimal("128")),
        # Beyond the 28 digits of the default decimal context: must not be rounded.
        (10**37 + 7, "decimal(38,10)", Decimal(f"{10**37 + 7}E-10")),
        (-(10**39), "decimal(40,5)", Decimal(f"{-(10**39)}E-5")),
    ],
)
def test_decimals_round_trip(unscaled, type_name, expected):
    table = rows_to_table([{"p": decimal_bytes(unscaled)}], {"p": type_name})
    assert table.column("p").to_pylist() == [expected]


def test_dates_and_naive_timestamps_accept_iso_text():
    types = {"d": "date32", "t": "timestamp_us"}
    table = rows_to_table([{"d": "2024-01-02", "t": "2024-01-02T03:04:05.5"}], types)
    expected = {"d": date(2024, 1, 2), "t": datetime(2024, 1, 2, 3, 4, 5, 500000)}
    assert table.to_pylist() == [expected]


def test_string_columns_take_any_json_value():
    table = rows_to_table([{"s": 1}, {"s": True}, {"s": [1, "a"]}, {"s": 1.5}], {"s": "string"})
    assert table.column("s").to_pylist() == ["1", "true", '[1,"a"]', "1.5"]


@pytest.mark.parametrize(
    ("value", "type_name"),
    [
        (SECRET, "int64"),
        (True, "int64"),
        (300, "int8"),
        (1.5, "int32"),
        (SECRET, "float64"),
        (1, "bool"),
        (SECRET + "!", "binary"),
        (SECRET, "date32"),
        (SECRET, "timestamp_us_utc"),
        (SECRET, "timestamp_ms"),
        (SECRET + "!", "decimal(10,2)"),
        (decimal_bytes(10**12), "decimal(5,2)"),
    ],
)
def test_unconvertible_values_name_column_and_type_only(value, type_name):
    with pytest.raises(ValueError) as caught:
        rows_to_table([{"col": value}], {"col": type_name})
    message = str(caught.value)
    assert message == f"column 'col': a value cannot be converted to {type_name}"
    assert SECRET not in message and caught.value.__cause__ is None


def test_rows_to_table_without_rows_or_columns():
    assert rows_to_table([], {"a": "int64"}).schema == pa.schema([pa.field("a", pa.int64())])
    assert rows_to_table([{"a": 1}], {}).num_columns == 0


# --- inference and merging -------------------------------------------------------------


def test_infer_types():
    rows = [
        {"b": True, "i": 1, "n": None, "mix": 1, "s": "a"},
        {"i": 2, "f": 1.5, "mix": 2.5, "obj": {"k": 1}, "lst": [1], "odd": 1},
        {"odd": "x", "bi": True},
        {"bi": 1},
    ]
    assert infer_types(rows) == {
        "b": "bool",
        "i": "int64",
        "n": "string",
        "mix": "float64",
        "s": "string",
        "f": "float64",
        "obj": "string",
        "lst": "string",
        "odd": "string",
        "bi": "string",
    }
    assert infer_types([]) == {}


def test_inferred_types_build_a_table():
    rows = [{"id": 1, "x": 1.5, "tags": ["a"]}, {"id": 2, "x": 2, "ok": False}]
    table = rows_to_table(rows, infer_types(rows))
    assert table.to_pylist() == [
        {"id": 1, "x": 1.5, "tags": '["a"]', "ok": None},
        {"id": 2, "x": 2.0, "tags": None, "ok": False},
    ]


def test_merge_types():
    old = {"a": "int32", "b": "int64", "c": "string", "d": "float32", "e": "bool"}
    new = {"new": "date32", "e": "int64", "d": "int16", "c": "int64", "b": "float64", "a": "int8"}
    merged = merge_types(old, new)
    assert list(merged) == ["a", "b", "c", "d", "e", "new"]
    assert merged == {
        "a": "int64",
        "b": "float64",
        "c": "string",
        "d": "float64",
        "e": "bool",
        "new": "date32",
    }
    assert merge_types(old, old) == old
    assert merge_types({}, new) == new


def test_merge_types_widens_decimals_to_hold_both():
    assert merge_types({"m": "decimal(8,2)"}, {"m": "decimal(12,2)"}) == {"m": "decimal(12,2)"}
    assert merge_types({"m": "decimal(12,2)"}, {"m": "decimal(8,2)"}) == {"m": "decimal(12,2)"}
    assert merge_types({"m": "decimal(8,2)"}, {"m": "decimal(8,4)"}) == {"m": "decimal(10,4)"}
    assert merge_types({"m": "decimal(38,2)"}, {"m": "decimal(38,4)"}) == {"m": "decimal(38,2)"}  # no 128-bit type holds both
    assert merge_types({"m": "decimal(8,2)"}, {"m": "string"}) == {"m": "decimal(8,2)"}


_LIST_WORDS = ["vip", "größe", "🏷", "o'neil", 'say "hi"', "back\\slash", "tab\there", "", None]


@pytest.mark.parametrize("seed", [0, 1, 2, 3, run_seed(1 << 30)])
def test_string_list_texts_are_what_json_dumps_writes(seed: int) -> None:
    """Lists of texts (nulls, empty lists, null items; items needing escapes repeating, written once each) as
    compact JSON, as `json.dumps` writes each list."""
    rng = random.Random(seed)
    lists = [None if rng.random() < 0.1 else [rng.choice(_LIST_WORDS) for _ in range(rng.randrange(4))]
             for _ in range(rng.randrange(1, 300))]
    texts = string_list_texts(pa.array(lists, pa.list_(pa.string())))
    assert texts.to_pylist() == [None if items is None else json.dumps(items, separators=(",", ":"))
                                 for items in lists], seed


def test_binary_array_equals_pyarrows_own_conversion() -> None:
    for values in ([], [b""], [b"a", b"", b"\x00\xff" * 300, b"{}"], [bytes([i % 256]) * i for i in range(200)]):
        built = binary_array(values)
        assert built.type == pa.binary() and built.equals(pa.array(values, pa.binary())), values[:3]
