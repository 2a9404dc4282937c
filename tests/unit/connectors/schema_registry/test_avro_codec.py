"""Avro <-> JSON-form codec, without a registry: type mapping, round trips, errors."""

from __future__ import annotations

import base64
import io
import json
from datetime import date, datetime, timezone
from decimal import Decimal

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.delta.arrow_types import TypeName, rows_to_table
from connectors.delta.connect_types import connect_schema_to_types
from connectors.schema_registry.avro_codec import AvroRecordCodec, without_logical_types
from connectors.schema_registry.avro_types import (
    avro_name,
    avro_schema_for,
    avro_type,
    column_type,
    debezium_envelope_schema,
)
from connectors.schema_registry.errors import AvroEncodeError, AvroSchemaError

SECRET = "s3cr3t-personal-data"
ALL_TYPES = {
    "i8": TypeName.INT8, "i16": TypeName.INT16, "i32": TypeName.INT32, "i64": TypeName.INT64,
    "f32": TypeName.FLOAT32, "f64": TypeName.FLOAT64, "flag": TypeName.BOOL, "text": TypeName.STRING,
    "blob": TypeName.BINARY, "day": TypeName.DATE32, "t_ms": TypeName.TIMESTAMP_MS,
    "t_us": TypeName.TIMESTAMP_US, "t_ns": TypeName.TIMESTAMP_NS, "t_utc": TypeName.TIMESTAMP_US_UTC,
    "price": "decimal(10,2)", "huge": "decimal(40,5)",
}


def _unscaled_base64(unscaled: int) -> str:
    return base64.b64encode(unscaled.to_bytes(unscaled.bit_length() // 8 + 1, "big", signed=True)).decode()


def _opt(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return st.none() | strategy


JSON_VALUES = {
    "i8": st.integers(-(2**7), 2**7 - 1), "i16": st.integers(-(2**15), 2**15 - 1),
    "i32": st.integers(-(2**31), 2**31 - 1), "i64": st.integers(-(2**63), 2**63 - 1),
    "f32": st.floats(width=32, allow_nan=False, allow_infinity=False),
    "f64": st.floats(allow_nan=False, allow_infinity=False), "flag": st.booleans(),
    "text": st.text(st.characters(blacklist_categories=("Cs",))),
    "blob": st.binary().map(lambda b: base64.b64encode(b).decode()),
    "day": st.integers(-700_000, 2_900_000),
    "t_ms": st.integers(-(10**14), 10**14), "t_us": st.integers(-(10**17), 10**17),
    "t_ns": st.integers(-(10**18), 10**18), "t_utc": st.integers(-(10**17), 10**17),
    "price": st.integers(-(10**10) + 1, 10**10 - 1).map(_unscaled_base64),
    "huge": st.integers(-(10**40) + 1, 10**40 - 1).map(_unscaled_base64),
}


@settings(max_examples=150, deadline=None)
@given(st.fixed_dictionaries({name: _opt(values) for name, values in JSON_VALUES.items()}))
def test_round_trip_of_every_type_and_null_in_json_form(row: dict) -> None:
    codec = AvroRecordCodec.compile(avro_schema_for("Row", ALL_TYPES, namespace="t"))
    decoded = codec.read(codec.write(row))
    assert decoded == row
    assert json.loads(json.dumps(decoded)) == decoded  # travels as JSON text unchanged
    assert rows_to_table([decoded], ALL_TYPES).equals(rows_to_table([row], ALL_TYPES))


def test_arrow_python_objects_encode_to_the_same_values() -> None:
    codec = AvroRecordCodec.compile(avro_schema_for("Row", ALL_TYPES))
    moment = datetime(2026, 11, 21, 8, 30, 15, 123456)
    objects = {
        "i8": -5, "i16": 300, "i32": 70_000, "i64": 2**40, "f32": 0.5, "f64": 1e300, "flag": False,
        "text": "Zürich ✓", "blob": b"\x00\xff", "day": date(1969, 12, 31), "t_ms": datetime(2026, 1, 2, 3, 4, 5, 6000),
        "t_us": moment, "t_ns": moment, "t_utc": moment.replace(tzinfo=timezone.utc),
        "price": Decimal("-12.30"), "huge": Decimal("123456789012345678901234567890.12345"),
    }
    decoded = codec.read(codec.write(objects))
    assert decoded["day"] == -1 and decoded["blob"] == "AP8=" and decoded["t_ms"] == 1_767_323_045_006
    assert rows_to_table([decoded], ALL_TYPES).to_pylist() == [objects]


@pytest.mark.parametrize(
    ("avro", "expected"),
    [
        ("int", "int32"), ("long", "int64"), ("float", "float32"), ("double", "float64"),
        ("boolean", "bool"), ("string", "string"), ("bytes", "binary"), (["null", "long"], "int64"),
        (["long", "null"], "int64"), (["null", "long", "string"], "string"),
        ({"type": "int", "connect.type": "int16"}, "int16"), ({"type": "int", "connect.type": "int8"}, "int8"),
        ({"type": "int", "logicalType": "date"}, "date32"), ({"type": "int", "logicalType": "time-millis"}, "int64"),
        ({"type": "long", "logicalType": "time-micros"}, "int64"),
        ({"type": "long", "logicalType": "timestamp-millis"}, "timestamp_us_utc"),
        ({"type": "long", "logicalType": "timestamp-micros"}, "timestamp_us_utc"),
        ({"type": "long", "logicalType": "local-timestamp-millis"}, "timestamp_ms"),
        ({"type": "string", "logicalType": "uuid"}, "string"),
        ({"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}, "decimal(12,3)"),
        ({"type": "fixed", "name": "F", "size": 8, "logicalType": "decimal", "precision": 18, "scale": 0},
         "decimal(18,0)"),
        ({"type": "fixed", "name": "G", "size": 4}, "binary"),
        ({"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"}, "timestamp_us"),
        ({"type": "long", "connect.name": "io.debezium.time.NanoTimestamp"}, "timestamp_ns"),
        ({"type": "long", "connect.name": "org.apache.kafka.connect.data.Timestamp",
          "logicalType": "timestamp-millis"}, "timestamp_ms"),
        ({"type": "int", "connect.name": "io.debezium.time.Date"}, "date32"),
        ({"type": "string", "connect.name": "io.debezium.time.ZonedTimestamp"}, "timestamp_us_utc"),
        ({"type": "bytes", "connect.name": "org.apache.kafka.connect.data.Decimal", "logicalType": "decimal",
          "precision": 64, "scale": 2, "connect.parameters": {"scale": "2"}}, "decimal(38,2)"),
        ({"type": "long", "logicalType": "some-future-type"}, "int64"),
        ({"type": "enum", "name": "E", "symbols": ["A", "B"]}, "string"),
        ({"type": "array", "items": "long"}, "string"), ({"type": "map", "values": "bytes"}, "string"),
        ({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}, "string"),
    ],
)
def test_avro_types_map_to_type_names(avro, expected: str) -> None:
    named: dict = {}
    parsed = fastavro.parse_schema({"type": "record", "name": "Row", "fields": [{"name": "c", "type": avro}]}, named)
    assert column_type(parsed["fields"][0]["type"], named) == expected


@given(st.integers(1, 76).flatmap(lambda p: st.tuples(st.just(p), st.integers(0, p))))
def test_built_schemas_map_back_to_their_type_names(precision_scale: tuple[int, int]) -> None:
    columns = {**ALL_TYPES, "d": f"decimal({precision_scale[0]},{precision_scale[1]})"}
    codec = AvroRecordCodec.compile(avro_schema_for("Row", columns, required=("i64",)))
    assert codec.column_types == columns and not codec.is_envelope


def test_flat_records_decode_with_their_column_types() -> None:
    codec = AvroRecordCodec.compile(avro_schema_for("Key", {"id": "int64"}, required=("id",)))
    assert codec.read(codec.write({"id": 7})) == {"id": 7}
    assert codec.column_types == {"id": "int64"}


# A Debezium envelope as Confluent's AvroConverter writes it, and the same as the JSON converter would.
def _connect_field(name: str, kind: str, logical: str | None = None, **params: str) -> dict:
    field = {"type": kind, "optional": True, "field": name}
    if logical:
        field.update(name=logical, version=1)
    return {**field, "parameters": params} if params else field


def _avro_field(name: str, kind: str, logical: str | None = None, **extra) -> dict:
    avro = {"type": kind, **extra}
    if logical:
        avro.update({"connect.version": 1, "connect.name": logical})
    return {"name": name, "type": ["null", avro if len(avro) > 1 else kind], "default": None}


DECIMAL = "org.apache.kafka.connect.data.Decimal"
DEBEZIUM_COLUMNS = [  # (name, connect type, connect logical name, avro type, avro extras)
    ("id", "int32", None, "int", {}),
    ("small", "int16", None, "int", {"connect.type": "int16"}),
    ("big", "int64", None, "long", {}),
    ("ratio", "float32", None, "float", {}),
    ("amount", "float64", None, "double", {}),
    ("flag", "boolean", None, "boolean", {}),
    ("name", "string", None, "string", {}),
    ("blob", "bytes", None, "bytes", {}),
    ("price", "bytes", DECIMAL, "bytes", {"logicalType": "decimal", "precision": 10, "scale": 2,
                                          "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"}}),
    ("born", "int32", "io.debezium.time.Date", "int", {}),
    ("seen", "int64", "io.debezium.time.MicroTimestamp", "long", {}),
    ("created", "int64", "org.apache.kafka.connect.data.Timestamp", "long", {"logicalType": "timestamp-millis"}),
    ("zoned", "string", "io.debezium.time.ZonedTimestamp", "string", {}),
    ("starts", "int64", "io.debezium.time.MicroTime", "long", {}),
    ("uid", "string", "io.debezium.data.Uuid", "string", {}),
]
CONNECT_ROW = {
    "type": "struct", "optional": True, "name": "db.public.t.Value",
    "fields": [
        _connect_field(n, k, lg, **({"scale": "2", "connect.decimal.precision": "10"} if lg == DECIMAL else {}))
        for n, k, lg, _, _ in DEBEZIUM_COLUMNS
    ],
}
CONNECT_ENVELOPE = {"type": "struct", "fields": [{**CONNECT_ROW, "field": "before"}, {**CONNECT_ROW, "field": "after"},
                                                 {"type": "string", "field": "op"}]}
AVRO_ENVELOPE = {
    "type": "record", "name": "Envelope", "namespace": "db.public.t",
    "fields": [
        {"name": "before", "type": ["null", {"type": "record", "name": "Value", "fields": [
            _avro_field(n, a, lg, **extra) for n, _, lg, a, extra in DEBEZIUM_COLUMNS]}], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
                                    "fields": [{"name": "version", "type": "string"},
                                               {"name": "snapshot", "type": [{"type": "string", "connect.version": 1,
                                                "connect.name": "io.debezium.data.Enum"}, "null"]},
                                               {"name": "lsn", "type": ["null", "long"], "default": None}]}},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
}
PYTHON_ROW = {  # as a Java producer holds the row: fastavro writes it through the logical types
    "id": 1, "small": -2, "big": 2**40, "ratio": 0.25, "amount": -1.5, "flag": True, "name": SECRET,
    "blob": b"\x01\x02\xff", "price": Decimal("-1234.50"), "born": 19_000, "seen": 1_790_000_000_123_456,
    "created": datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc), "zoned": "2026-01-02T03:04:05.678901Z",
    "starts": 3_600_000_000, "uid": "0b2d6a3e-7c71-4d3c-9a59-0e4f0f1f6f8a",
}
JSON_ROW = {  # the same row as Debezium's JSON converter writes it
    **PYTHON_ROW, "blob": "AQL/", "price": _unscaled_base64(-123450), "created": 1_767_323_045_678,
}


def _confluent_body(schema: dict, record: dict) -> bytes:
    stream = io.BytesIO()
    fastavro.schemaless_writer(stream, fastavro.parse_schema(schema), record)
    return stream.getvalue()


def test_debezium_avro_envelope_decodes_like_the_json_envelope() -> None:
    source = {"version": "3.6.3", "snapshot": "false", "lsn": 99}
    body = _confluent_body(AVRO_ENVELOPE, {"before": None, "after": PYTHON_ROW, "source": source, "op": "c",
                                           "ts_ms": 5})
    codec = AvroRecordCodec.compile(AVRO_ENVELOPE)
    assert codec.is_envelope
    assert codec.read(body) == {"before": None, "after": JSON_ROW, "source": source, "op": "c", "ts_ms": 5}
    assert codec.column_types == connect_schema_to_types(CONNECT_ENVELOPE)


def test_json_row_and_decoded_avro_row_give_the_same_table() -> None:
    codec = AvroRecordCodec.compile(AVRO_ENVELOPE)
    source = {"version": "3", "snapshot": None, "lsn": None}
    body = _confluent_body(AVRO_ENVELOPE, {"before": PYTHON_ROW, "after": None, "source": source, "op": "d"})
    decoded = codec.read(body)["before"]
    table = rows_to_table([decoded], codec.column_types)
    assert table.equals(rows_to_table([JSON_ROW], connect_schema_to_types(CONNECT_ENVELOPE)))
    assert table.column("price")[0].as_py() == Decimal("-1234.50")
    assert table.column("created")[0].as_py() == datetime(2026, 1, 2, 3, 4, 5, 678000)


def test_timestamp_millis_and_nanos_instants_become_microseconds() -> None:
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "ns", "type": ["null", {"type": "long", "logicalType": "timestamp-nanos"}]}]}
    codec = AvroRecordCodec.compile(schema)
    body = _confluent_body(without_logical_types(schema), {"ms": 1_500, "ns": 2_000_999})
    assert codec.read(body) == {"ms": 1_500_000, "ns": 2_000}
    assert codec.read(codec.write({"ms": 1_500_000, "ns": 2_000})) == {"ms": 1_500_000, "ns": 2_000}


def test_nested_values_stay_json_with_bytes_as_base64() -> None:
    schema = {"type": "record", "name": "Node", "fields": [
        {"name": "tag", "type": "bytes"},
        {"name": "next", "type": ["null", "Node"], "default": None},
        {"name": "attrs", "type": {"type": "map", "values": ["null", "bytes"]}},
        {"name": "any", "type": ["null", "long", "bytes"]}]}
    codec = AvroRecordCodec.compile(schema)
    raw = {"tag": b"\x00", "next": {"tag": b"\x01", "next": None, "attrs": {}, "any": b"\x02"},
           "attrs": {"a": b"\x03", "b": None}, "any": 5}
    assert codec.read(_confluent_body(schema, raw)) == {
        "tag": "AA==", "next": {"tag": "AQ==", "next": None, "attrs": {}, "any": "Ag=="},
        "attrs": {"a": "Aw==", "b": None}, "any": 5}
    assert codec.column_types == {"tag": "binary", "next": "string", "attrs": "string", "any": "string"}
    flat = {"tag": "AA==", "next": None, "attrs": {"a": "Aw==", "b": None}, "any": 5}
    assert codec.read(codec.write(flat)) == flat


def test_without_logical_types_strips_annotations_only() -> None:
    stripped = without_logical_types(AVRO_ENVELOPE)
    assert "logicalType" not in json.dumps(stripped)
    assert json.dumps(stripped).count("connect.name") == json.dumps(AVRO_ENVELOPE).count("connect.name")


@pytest.mark.parametrize(
    ("mangle", "problem"),
    [(lambda body: body[:-3], "ends before"), (lambda body: body + b"\x00\x00", "2 bytes follow"),
     (lambda body: b"\x7f" + body[1:], "unreadable")],
)
def test_bodies_that_do_not_fit_the_schema(mangle, problem: str) -> None:
    codec = AvroRecordCodec.compile(debezium_envelope_schema("t", {"id": "int64", "email": "string"}))
    body = codec.write({"before": None, "after": {"id": 1, "email": SECRET}, "op": "c", "ts_ms": 1})
    with pytest.raises(ValueError, match=problem) as caught:
        codec.read(mangle(body))
    assert SECRET not in str(caught.value)


def test_invalid_utf8_in_a_string_is_a_body_error() -> None:
    codec = AvroRecordCodec.compile(avro_schema_for("R", {"s": "string"}, required=("s",)))
    with pytest.raises(ValueError, match="UTF-8"):
        codec.read(b"\x04\xff\xfe")


@pytest.mark.parametrize(
    ("record", "problem"),
    [({"price": Decimal("1.234")}, "'price': a value has more than 2 fraction digits"),
     ({"price": Decimal("123456789.1")}, "'price': a value has more than 10 digits"),
     ({"day": SECRET}, "'day': a value cannot be converted"),
     ({"i64": SECRET}, "does not fit its Avro schema"),
     ({"unknown_column": 1}, "does not fit its Avro schema")],
)
def test_records_that_do_not_fit_name_the_field_not_the_value(record: dict, problem: str) -> None:
    codec = AvroRecordCodec.compile(avro_schema_for("Row", ALL_TYPES))
    with pytest.raises(AvroEncodeError, match=problem) as caught:
        codec.write(record)
    assert SECRET not in str(caught.value)


def test_envelope_errors_name_the_field_path() -> None:
    codec = AvroRecordCodec.compile(debezium_envelope_schema("t", {"id": "int64", "d": "date32"}))
    with pytest.raises(AvroEncodeError, match="field 'after.d'"):
        codec.write({"after": {"id": 1, "d": "not a date"}, "op": "c"})


def test_schema_errors() -> None:
    with pytest.raises(AvroSchemaError, match="not a record"):
        AvroRecordCodec.compile("string")
    with pytest.raises(AvroSchemaError, match="has no Avro counterpart"):
        avro_schema_for("R", {"a": "uuid"})
    with pytest.raises(AvroSchemaError, match="not a valid Avro field name"):
        avro_schema_for("R", {"first-name": "string"})
    with pytest.raises(AvroSchemaError, match="scale <= precision"):
        avro_type("decimal(2,5)")


def test_avro_names_from_topic_names() -> None:
    assert avro_name("cdc.public.users") == "cdc.public.users"
    assert avro_name("avro-test.2026") == "avro_test._2026"
    fastavro.parse_schema(debezium_envelope_schema(avro_name("9-lives.x-y"), {"id": "int64"}))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_arbitrary_bytes_decode_or_fail_with_a_body_problem(body: bytes) -> None:
    codec = AvroRecordCodec.compile(debezium_envelope_schema("t", {"id": "int64", "s": "string", "p": "decimal(9,1)"}))
    try:
        document = codec.read(body)
    except ValueError as exc:
        assert any(word in str(exc) for word in ("ends before", "UTF-8", "unreadable", "follow the end"))
    else:
        assert json.loads(json.dumps(document)) == document
