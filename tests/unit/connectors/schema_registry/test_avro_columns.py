"""Avro in bulk (`avro_columns`) against the reference decoder (`ConfluentAvroDecoder`), record by record.

Schemas are registered in the in-process registry double; bodies are written by fastavro with the
schema stripped of logical types, so every value is the raw number, text or bytes a Java producer
writes. The bulk columns must equal `typed_column` over the reference's documents.
"""

from __future__ import annotations

import io
from datetime import datetime, timedelta, timezone
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.delta.arrow_types import rows_to_table, typed_column
from connectors.schema_registry import avro_columns
from connectors.schema_registry.avro_codec import ConfluentAvroDecoder, without_logical_types
from connectors.schema_registry.avro_columns import (
    BulkAvroDecoder,
    BulkDecoded,
    decode_avro_columns,
)
from connectors.schema_registry.avro_types import column_type
from connectors.schema_registry.client import SchemaRegistryClient
from connectors.schema_registry.errors import DecodeError
from connectors.schema_registry.wire_format import frame
from tests.support.schema_registry_double import SchemaRegistryDouble

DECIMAL = "org.apache.kafka.connect.data.Decimal"
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
INT64 = st.integers(-(2**63), 2**63 - 1)


def _unscaled_bytes(unscaled: int, size: int | None = None) -> bytes:
    return unscaled.to_bytes(size or unscaled.bit_length() // 8 + 1, "big", signed=True)


def _zoned(moment: datetime, digits: int) -> str:
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{moment.microsecond:06d}{moment.microsecond % 997:03d}"[:digits]
    return f"{text}.{fraction}Z" if digits else f"{text}Z"


MOMENTS = st.datetimes(datetime(1900, 1, 1), datetime(2200, 1, 1))
ZONED = st.builds(_zoned, MOMENTS, st.integers(0, 9))


def _decimal_kind(precision: int, scale: int) -> tuple[Any, st.SearchStrategy]:
    avro = {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale,
            "connect.version": 1, "connect.name": DECIMAL,
            "connect.parameters": {"scale": str(scale), "connect.decimal.precision": str(precision)}}
    limit = 10**precision - 1
    return avro, st.integers(-limit, limit).map(_unscaled_bytes) | st.just(b"")


# kind -> (Avro type builder taking a unique name, raw value strategy)
KINDS: dict[str, tuple[Any, st.SearchStrategy]] = {
    "int": (lambda n: "int", st.integers(-(2**31), 2**31 - 1)),
    "long": (lambda n: "long", INT64),
    "int16": (lambda n: {"type": "int", "connect.type": "int16"}, st.integers(-(2**15), 2**15 - 1)),
    "float": (lambda n: "float", st.floats(width=32, allow_nan=False)),
    "double": (lambda n: "double", st.floats(allow_nan=False)),
    "boolean": (lambda n: "boolean", st.booleans()),
    "string": (lambda n: "string", st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)),
    "bytes": (lambda n: "bytes", st.binary(max_size=12)),
    "numeric(12,2)": (lambda n: _decimal_kind(12, 2)[0], _decimal_kind(12, 2)[1]),
    "numeric(38,0)": (lambda n: _decimal_kind(38, 0)[0], _decimal_kind(38, 0)[1]),
    "numeric(40,5)": (lambda n: _decimal_kind(40, 5)[0], _decimal_kind(40, 5)[1]),
    "fixed decimal": (lambda n: {"type": "fixed", "name": f"F{n}", "size": 8, "logicalType": "decimal",
                                 "precision": 18, "scale": 3},
                      st.integers(-(10**18) + 1, 10**18 - 1).map(lambda u: _unscaled_bytes(u, 8))),
    "timestamp-micros": (lambda n: {"type": "long", "logicalType": "timestamp-micros"},
                         st.integers(-(10**17), 10**17)),
    "timestamp-millis": (lambda n: {"type": "long", "logicalType": "timestamp-millis"},
                         st.integers(-(10**14), 10**14)),
    "timestamp-nanos": (lambda n: {"type": "long", "logicalType": "timestamp-nanos"}, INT64),
    "local-timestamp-micros": (lambda n: {"type": "long", "logicalType": "local-timestamp-micros"},
                               st.integers(-(10**17), 10**17)),
    "MicroTimestamp": (lambda n: {"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"},
                       st.integers(-(10**17), 10**17)),
    "NanoTimestamp": (lambda n: {"type": "long", "connect.name": "io.debezium.time.NanoTimestamp"}, INT64),
    "Connect Timestamp": (lambda n: {"type": "long", "connect.name": "org.apache.kafka.connect.data.Timestamp",
                                     "logicalType": "timestamp-millis"}, st.integers(-(10**14), 10**14)),
    "date": (lambda n: {"type": "int", "logicalType": "date"}, st.integers(-700_000, 2_900_000)),
    "Debezium Date": (lambda n: {"type": "int", "connect.name": "io.debezium.time.Date"},
                      st.integers(-700_000, 2_900_000)),
    "time-micros": (lambda n: {"type": "long", "logicalType": "time-micros"}, st.integers(0, 86_400_000_000)),
    "time-millis": (lambda n: {"type": "int", "logicalType": "time-millis"}, st.integers(0, 86_400_000)),
    "ZonedTimestamp": (lambda n: {"type": "string", "connect.name": "io.debezium.time.ZonedTimestamp"}, ZONED),
    # up to 6 fraction digits, as Debezium writes them: Arrow's ISO-8601 cast takes the whole column
    "ZonedTimestamp us": (lambda n: {"type": "string", "connect.name": "io.debezium.time.ZonedTimestamp"},
                          st.builds(_zoned, MOMENTS, st.integers(0, 6))),
    "uuid": (lambda n: {"type": "string", "logicalType": "uuid"}, st.uuids().map(str)),
    "enum": (lambda n: {"type": "enum", "name": f"E{n}", "symbols": ["A", "B", "C"]}, st.sampled_from("ABC")),
    "fixed": (lambda n: {"type": "fixed", "name": f"X{n}", "size": 4}, st.binary(min_size=4, max_size=4)),
    "array": (lambda n: {"type": "array", "items": ["null", "long"]}, st.lists(st.none() | INT64, max_size=3)),
    "record": (lambda n: {"type": "record", "name": f"R{n}", "fields": [
        {"name": "a", "type": ["null", "bytes"]}, {"name": "b", "type": "long"}]},
        st.fixed_dictionaries({"a": st.none() | st.binary(max_size=4), "b": INT64})),
}
NULLABILITY = ("required", "null first", "null second")


@st.composite
def debezium_schemas(draw: st.DrawFn, namespace: str) -> tuple[dict, dict[str, st.SearchStrategy]]:
    """A Debezium envelope with 1-8 row columns of drawn kinds and nullability, and their values."""
    chosen = draw(st.lists(st.tuples(st.sampled_from(sorted(KINDS)), st.sampled_from(NULLABILITY)),
                           min_size=1, max_size=8))
    fields, strategies = [], {}
    for number, (kind, nullable) in enumerate(chosen):
        build, strategy = KINDS[kind]
        name = f"c{number}"
        avro = build(name)
        if nullable == "required":
            fields.append({"name": name, "type": avro})
        else:
            union = ["null", avro] if nullable == "null first" else [avro, "null"]
            fields.append({"name": name, "type": union, **({"default": None} if nullable == "null first" else {})})
            strategy = st.none() | strategy
        strategies[name] = strategy
    value = {"type": "record", "name": "Value", "fields": fields}
    source = {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql", "fields": [
        {"name": "version", "type": "string"}, {"name": "lsn", "type": ["null", "long"]}]}
    envelope = {"type": "record", "name": "Envelope", "namespace": namespace, "fields": [
        {"name": "before", "type": ["null", value], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": source},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None}]}
    return envelope, strategies


def _body(schema: dict, record: dict) -> bytes:
    stream = io.BytesIO()
    fastavro.schemaless_writer(stream, fastavro.parse_schema(without_logical_types(schema)), record)
    return stream.getvalue()


@st.composite
def envelopes(draw: st.DrawFn, columns: dict[str, st.SearchStrategy]) -> dict:
    row = st.fixed_dictionaries(columns)
    op = draw(st.sampled_from("crud"))
    return {"before": draw(st.none() | row) if op in "ud" else None, "after": None if op == "d" else draw(row),
            "source": {"version": "3.6.3", "lsn": draw(st.none() | INT64)}, "op": op,
            "ts_ms": draw(st.none() | st.integers(0, 2**50))}


@pytest.fixture(scope="module")
def client():
    with SchemaRegistryDouble(compatibility="NONE") as registry:
        yield SchemaRegistryClient(registry.url)


def _reference(decoder: ConfluentAvroDecoder, value: bytes) -> tuple[dict, dict] | None:
    try:
        return decoder.decode(value)
    except DecodeError:
        return None


def assert_like_the_reference(values: list[bytes | None], decoded: BulkDecoded, decoder: ConfluentAvroDecoder,
                              never_fallback: set[int] = frozenset()) -> None:
    """Every record is in exactly one place; grouped ones equal the reference typed; refused ones fall back."""
    assert decoded.tombstones == [i for i, value in enumerate(values) if value is None]
    grouped = [i for group in decoded.groups.values() for i in group.indices]
    placed = sorted(grouped + decoded.fallback + decoded.tombstones)
    assert placed == list(range(len(values)))
    assert not set(decoded.fallback) & never_fallback
    for i in decoded.fallback:
        assert values[i] is not None
    for schema_id, group in decoded.groups.items():
        assert group.indices == sorted(group.indices) and group.table.num_rows == len(group.indices)
        references = [_reference(decoder, values[i]) for i in group.indices]
        assert all(reference is not None for reference in references), "the bulk path took a record the reference refuses"
        documents = [document for document, _ in references]
        assert group.column_types == decoder.codec(schema_id).column_types
        for side in ("before", "after"):
            expected = rows_to_table([document[side] for document in documents], group.column_types)
            images = group.table.column(side).combine_chunks()
            assert images.type.num_fields == expected.num_columns
            for name, got in zip(expected.column_names, images.flatten()):
                want = expected.column(name).combine_chunks()
                assert got.equals(want), (side, name, got.to_pylist()[:5], want.to_pylist()[:5])
            assert images.is_null().to_pylist() == [document[side] is None for document in documents]
        named: dict = {}
        parsed = fastavro.parse_schema(decoder.codec(schema_id).definition, named)
        for item in parsed["fields"]:
            if item["name"] in ("op", "ts_ms"):
                want = typed_column(item["name"], column_type(item["type"], named),
                                    [document[item["name"]] for document in documents])
                assert group.table.column(item["name"]).combine_chunks().equals(want)
        assert "source" not in group.table.column_names
    for i, value in enumerate(values):
        if value is not None and _reference(decoder, value) is None:
            assert i in decoded.fallback


@settings(max_examples=60, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_bulk_columns_equal_the_reference_record_by_record(client, data) -> None:
    first, first_columns = data.draw(debezium_schemas("db.public.a"), label="first schema")
    second, second_columns = data.draw(debezium_schemas("db.public.b"), label="second schema")
    ids = [client.register("a-value", first), client.register("b-value", second)]
    schemas, columns = [first, second], [first_columns, second_columns]
    which = data.draw(st.lists(st.sampled_from([0, 0, 1, None]), min_size=1, max_size=30), label="records")
    values: list[bytes | None] = []
    for side in which:
        if side is None:
            values.append(None)
        else:
            record = data.draw(envelopes(columns[side]))
            values.append(frame(ids[side], _body(schemas[side], record)))
    well_formed = {i for i, value in enumerate(values) if value is not None}
    # one damaged record, anywhere in the list: bytes after its end, a body cut short, or one byte of
    # the body replaced (a union index, a length, a UTF-8 byte...: the reference may refuse it or not)
    victim = data.draw(st.sampled_from(sorted(well_formed)), label="damaged") if well_formed else None
    if victim is not None:
        value = values[victim]
        damage = data.draw(st.sampled_from(["trailing bytes", "cut short", "byte replaced"]), label="damage")
        if damage == "trailing bytes":
            values[victim] = value + data.draw(st.binary(min_size=1, max_size=3))
        elif damage == "cut short":
            values[victim] = value[: data.draw(st.integers(5, len(value) - 1))]
        else:
            at = data.draw(st.integers(5, len(value) - 1), label="at")
            byte = data.draw(st.sampled_from([0x01, 0x03, 0x04, 0x06, 0x7F, 0x80, 0xC3, 0xFF]) | st.integers(0, 255))
            values[victim] = value[:at] + bytes([byte]) + value[at + 1:]
        well_formed.discard(victim)
    values += [frame(99_999, b"\x02"), b"\x00\x01", b"\x01" + values[-1][1:] if values[-1] else b"\x01\x00\x00\x00\x01"]
    decoder = ConfluentAvroDecoder(client)
    with pytest.MonkeyPatch.context() as patch:  # failed reads scanned by the reference, or halved to the record
        patch.setattr(avro_columns, "LOCATE", data.draw(st.sampled_from([avro_columns.LOCATE, 3, 1]), label="locate"))
        decoded = decode_avro_columns(values, decoder)
    assert_like_the_reference(values, decoded, decoder, never_fallback=well_formed)
    assert {len(values) - 3, len(values) - 2, len(values) - 1} <= set(decoded.fallback)
    if victim is not None and _reference(decoder, values[victim]) is None:
        assert victim in decoded.fallback


def _envelope(namespace: str, value_fields: list[dict]) -> dict:
    value = {"type": "record", "name": "Value", "fields": value_fields}
    return {"type": "record", "name": "Envelope", "namespace": namespace, "fields": [
        {"name": "before", "type": ["null", value], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "op", "type": "string"}]}


BENCH_LIKE = _envelope("db.public.orders", [
    {"name": "id", "type": "int"},
    {"name": "amount", "type": ["null", _decimal_kind(12, 2)[0]], "default": None},
    {"name": "at", "type": ["null", KINDS["ZonedTimestamp"][0]("at")], "default": None},
    {"name": "day", "type": ["null", KINDS["Debezium Date"][0]("day")], "default": None},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "flag", "type": ["null", "boolean"], "default": None}])


def _orders(client: SchemaRegistryClient, count: int) -> list[bytes]:
    schema_id = client.register("orders-value", BENCH_LIKE)
    rows = [{"id": i, "amount": _unscaled_bytes(i * 101 - 5000), "at": _zoned(EPOCH.replace(tzinfo=None)
             + timedelta(seconds=i * 7919, microseconds=i), i % 10), "day": 19_000 + i, "note": f"n{i}",
             "flag": i % 3 == 0} for i in range(count)]
    return [frame(schema_id, _body(BENCH_LIKE, {"before": None, "after": row, "op": "c"})) for row in rows]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", [0, 7, 19])
def test_trailing_bytes_fall_back_without_stalling_the_reader(client, where: int) -> None:
    values = _orders(client, 20)
    values[where] += b"\x00\x00"
    decoder = ConfluentAvroDecoder(client)
    decoded = decode_avro_columns(values, decoder)
    assert decoded.fallback == [where]
    assert_like_the_reference(values, decoded, decoder, never_fallback=set(range(20)) - {where})


def _with_refused_union_index(values: list[bytes], where: int) -> list[bytes]:
    """`values` with record `where`'s `before` union index made 3 (of 2 branches): the reader refuses it."""
    damaged = bytearray(values[where])
    damaged[5] = 3 * 2  # zigzag
    return [*values[:where], bytes(damaged), *values[where + 1:]]


def _counting_reads(monkeypatch) -> list[int]:
    """The sizes of the Rust reader's reads from now on."""
    reads: list[int] = []
    original = avro_columns._Plan.read
    monkeypatch.setattr(avro_columns._Plan, "read",
                        lambda plan, framed, sentinel: reads.append(len(framed)) or original(plan, framed, sentinel))
    return reads


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("where", "count"), [(0, 6), (37, 7), (1000, 5), (1999, 4)])
def test_a_record_the_reader_refuses_costs_a_few_more_reads(client, where: int, count: int, monkeypatch) -> None:
    """A union index the reader refuses (3 of 2 branches) in 2,000 records: the failed read is halved
    twice (a second half is read only when its first half failed too), the 500-record part that fails
    is scanned with the reference reader, and the records on either side of the one it refuses are
    read: four to seven reads in all, about 2.5 times the records."""
    values = _with_refused_union_index(_orders(client, 2000), where)
    reads = _counting_reads(monkeypatch)
    decoder = ConfluentAvroDecoder(client)
    decoded = decode_avro_columns(values, decoder)
    assert decoded.fallback == [where]
    assert_like_the_reference(values, decoded, decoder, never_fallback=set(range(2000)) - {where})
    assert len(reads) == count and sum(reads) <= 5500, reads


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", [0, 37, 63, 99])
def test_a_record_the_reference_reads_but_the_reader_refuses_is_found_by_halving(client, where: int,
                                                                                 monkeypatch) -> None:
    """Where the reference scan finds nothing to refuse, the failed part is halved down to the record,
    and no part of it is scanned again."""
    values = _with_refused_union_index(_orders(client, 100), where)
    scans: list[tuple[int, int]] = []
    monkeypatch.setattr(avro_columns._Plan, "refused", lambda plan, framed, start, end: scans.append((start, end)))
    reads = _counting_reads(monkeypatch)
    decoder = ConfluentAvroDecoder(client)
    decoded = decode_avro_columns(values, decoder)
    assert decoded.fallback == [where]
    assert_like_the_reference(values, decoded, decoder, never_fallback=set(range(100)) - {where})
    assert scans == [(0, 100)] and len(reads) <= 1 + 2 * 7, (scans, reads)


@pytest.mark.timeout(120)
def test_a_lone_record_with_trailing_bytes_falls_back(client) -> None:
    value = _orders(client, 1)[0] + b"\x04"
    assert decode_avro_columns([value], client).fallback == [0]


def test_every_record_malformed_falls_back_one_by_one(client) -> None:
    values = [value[:-1] for value in _orders(client, 9)]
    decoded = decode_avro_columns(values, client)
    assert decoded.fallback == list(range(9)) and not decoded.groups


def test_maps_and_multi_type_unions_go_record_by_record(client) -> None:
    for extra in ({"type": "map", "values": "long"}, ["null", "long", "string"]):
        schema = _envelope("db.public.m", [{"name": "id", "type": "long"}, {"name": "x", "type": extra}])
        schema_id = client.register(f"m-{len(str(extra))}-value", schema)
        record = {"before": None, "after": {"id": 1, "x": {"k": 2} if isinstance(extra, dict) else 3}, "op": "c"}
        decoded = decode_avro_columns([frame(schema_id, _body(schema, record))], client)
        assert decoded.fallback == [0] and not decoded.groups


def test_a_value_beyond_its_column_type_sends_the_schema_id_record_by_record(client) -> None:
    values = _orders(client, 3)
    schema_id = client.register("orders-value", BENCH_LIKE)
    too_wide = {"id": 9, "amount": _unscaled_bytes(10**13), "at": None, "day": None, "note": None, "flag": None}
    values.append(frame(schema_id, _body(BENCH_LIKE, {"before": None, "after": too_wide, "op": "c"})))
    decoded = decode_avro_columns(values, client)
    assert decoded.fallback == [0, 1, 2, 3] and not decoded.groups
    with pytest.raises(ValueError, match="'amount'"):
        rows_to_table([ConfluentAvroDecoder(client).decode(values[3])[0]["after"]],
                      ConfluentAvroDecoder(client).codec(schema_id).column_types)


def test_flat_records_give_their_fields(client) -> None:
    schema = {"type": "record", "name": "Key", "namespace": "db.public.k", "fields": [
        {"name": "id", "type": "long"}, {"name": "at", "type": KINDS["timestamp-millis"][0]("at")}]}
    schema_id = client.register("k-key", schema)
    values = [frame(schema_id, _body(schema, {"id": i, "at": -1_500 * i})) for i in range(4)]
    decoded = BulkAvroDecoder(client).decode(values)
    table = decoded.groups[schema_id].table
    assert table.to_pylist()[1] == {"id": 1, "at": EPOCH - timedelta(milliseconds=1_500)}
    assert table.schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert not decoded.groups[schema_id].is_envelope
