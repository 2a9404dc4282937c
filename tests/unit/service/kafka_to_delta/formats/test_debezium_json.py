"""Debezium JSON through FROM_CHANGELOG: envelopes, ops, Debezium specifics, errors as data."""

from __future__ import annotations

import io
import json
import pickle
from datetime import datetime, timezone

import fastavro
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.kafka.range_reader import RAW_SCHEMA
from service.config.from_changelog import FromChangelogSettings
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder, connect_layout
from service.kafka_to_delta.changelog.from_changelog import (
    ChangelogRow,
    FromChangelog,
    Marker,
    RecordRejected,
)
from service.kafka_to_delta.formats.debezium_json import (
    UNAVAILABLE_VALUE,
    JsonDocuments,
    canonical_json,
    canonical_key,
    loads,
)
from service.kafka_to_delta.rows.arrow import CHANGELOG_SCHEMA
from vocabulary.changes import ChangeKind
from vocabulary.errors import DecodeError

PK = ("id",)
SECRET = "s3cr3t-personal-data"
SECRET_ROW = {"id": 1, "email": SECRET}

ROW_SCHEMA = {
    "type": "struct",
    "optional": True,
    "name": "dbserver1.inventory.customers.Value",
    "fields": [
        {"type": "int32", "optional": False, "field": "id"},
        {"type": "string", "optional": True, "field": "email"},
    ],
}
SOURCE_SCHEMA = {
    "type": "struct", "field": "source",
    "fields": [{"type": "int64", "field": "lsn"}, {"type": "string", "field": "snapshot"}],
}
ENVELOPE_SCHEMA = {
    "type": "struct",
    "name": "dbserver1.inventory.customers.Envelope",
    "fields": [
        {**ROW_SCHEMA, "field": "before"},
        {**ROW_SCHEMA, "field": "after"},
        SOURCE_SCHEMA,
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
    ],
}


def envelope(op, before=None, after=None, **extra) -> dict:
    """A bare Debezium payload."""
    return {"before": before, "after": after, "source": {"lsn": 1}, "op": op, "ts_ms": 1, **extra}


def encode(document, wrap: bool = False) -> bytes:
    """JSON bytes, optionally inside the Kafka Connect wrapper."""
    if wrap:
        document = {"schema": ENVELOPE_SCHEMA, "payload": document}
    return json.dumps(document).encode()


def key_bytes(wrap: bool = False, **values) -> bytes:
    if wrap:
        return json.dumps({"schema": {"type": "struct"}, "payload": values}).encode()
    return json.dumps(values).encode()


def decode(value, key=None, primary_key=PK, preset="debezium-upsert", **params) -> list[ChangelogRow]:
    """One record through the JSON decoder and FROM_CHANGELOG."""
    settings_ = FromChangelogSettings(preset=preset, **params)
    document, types = (None, None) if value is None else JsonDocuments(connect_layout(settings_))(value)
    return FromChangelog(settings_, primary_key).convert(document, key, types)


def decode_error(value, key=None, primary_key=PK, **params) -> DecodeError:
    with pytest.raises(DecodeError) as caught:
        decode(value, key, primary_key, **params)
    assert SECRET not in str(caught.value)
    return caught.value


def kafka_batch(records: list[tuple], partition: int = 2) -> pa.RecordBatch:
    """Kafka records (key, value) in `RAW_SCHEMA`, offsets from 10."""
    now = datetime(2024, 1, 2, tzinfo=timezone.utc)
    return pa.RecordBatch.from_pydict(
        {
            "key": [r[0] for r in records],
            "value": [r[1] for r in records],
            "topic": ["t"] * len(records),
            "partition": [partition] * len(records),
            "offset": list(range(10, 10 + len(records))),
            "timestamp": [now] * len(records),
            "headers": [[{"key": "h", "value": b"v"}]] * len(records),
        },
        schema=RAW_SCHEMA,
    )


# --- envelopes and ops -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "kind"),
    [("c", ChangeKind.INSERT), ("r", ChangeKind.INSERT), ("u", ChangeKind.UPDATE_AFTER)],
)
@pytest.mark.parametrize("wrap", [False, True])
def test_upserting_ops_give_the_after_image(op, kind, wrap):
    after = {"id": 7, "email": "a@x"}
    before = {"id": 7, "email": "old@x"} if op == "u" else None
    (change,) = decode(encode(envelope(op, before, after), wrap))
    assert (change.kind, change.key, change.row, change.unchanged) == (kind, "[7]", after, ())


def test_column_types_come_from_the_schema_block():
    value = encode(envelope("c", after={"id": 7, "email": "a"}), wrap=True)
    document, types = JsonDocuments()(value)
    assert types == {"id": "int32", "email": "string"} and document["op"] == "c"
    assert JsonDocuments()(encode(envelope("c", after={"id": 7}))) == (envelope("c", after={"id": 7}), None)
    layout = connect_layout(FromChangelogSettings(preset="debezium", passthrough=["ts_ms", "source.lsn", "source.x"]))
    _, types = JsonDocuments(layout)(value)
    assert types == {"id": "int32", "email": "string", "ts_ms": "int64", "source_lsn": "int64"}


def test_a_repeating_schema_block_gives_the_same_results_and_survives_pickling():
    decoder = JsonDocuments()
    values = [encode(envelope("c", after={"id": i, "email": "a"}), wrap=True) for i in range(3)]
    first = [decoder(value) for value in values]
    shipped = pickle.loads(pickle.dumps(decoder))
    assert [shipped(value) for value in values] == first == [JsonDocuments()(value) for value in values]


@pytest.mark.parametrize("wrap", [False, True])
def test_a_delete_passes_its_before_image_through(wrap):
    (change,) = decode(encode(envelope("d", before={"id": 7, "email": "a@x"}), wrap))
    assert (change.kind, change.key, change.row) == (ChangeKind.DELETE, "[7]", {"id": 7, "email": "a@x"})


@pytest.mark.parametrize("wrap_key", [False, True])
def test_delete_without_before_takes_the_kafka_key(wrap_key):
    (change,) = decode(encode(envelope("d")), key_bytes(wrap=wrap_key, id=7))
    assert (change.kind, change.key, change.row) == (ChangeKind.DELETE, "[7]", {"id": 7})


def test_composite_key_follows_primary_key_order():
    after = {"n": 3, "name": "a", "x": True}
    (change,) = decode(encode(envelope("c", after=after)), None, ("name", "n"))
    assert change.key == '["a",3]'
    (deleted,) = decode(encode(envelope("d")), key_bytes(n=3, name="a"), ("name", "n"))
    assert deleted.key == '["a",3]'


def test_json_number_types_are_kept():
    after = {"id": 1, "i": 10, "f": 10.0, "big": 2**70}
    (change,) = decode(encode(envelope("u", after=after)))
    assert change.row == after
    assert type(change.row["i"]) is int and type(change.row["f"]) is float


@pytest.mark.parametrize("value", [None, encode({"schema": ENVELOPE_SCHEMA, "payload": None})])
def test_tombstones_decode_to_nothing(value):
    assert decode(value, key_bytes(id=7)) == []


@pytest.mark.parametrize("wrap", [False, True])
def test_logical_messages_decode_to_nothing(wrap):
    message = {"op": "m", "ts_ms": 1, "message": {"prefix": "p", "content": SECRET}}
    assert decode(encode(message, wrap)) == []


# --- Debezium specifics -----------------------------------------------------------------


def test_update_with_before_image_is_retracted_and_without_it_only_the_after_is_emitted():
    full = decode(encode(envelope("u", {"id": 1, "email": "old"}, {"id": 1, "email": "new"})), preset="debezium")
    assert [(c.kind, c.row) for c in full] == [
        (ChangeKind.UPDATE_BEFORE, {"id": 1, "email": "old"}), (ChangeKind.UPDATE_AFTER, {"id": 1, "email": "new"}),
    ]
    default_identity = decode(encode(envelope("u", None, {"id": 1, "email": "new"})), preset="debezium")
    assert [(c.kind, c.row) for c in default_identity] == [(ChangeKind.UPDATE_AFTER, {"id": 1, "email": "new"})]


@pytest.mark.parametrize("marker", ["first", "first_in_data_collection", "true", "last_in_data_collection", "last"])
def test_snapshot_markers_are_carried(marker):
    value = encode(envelope("r", after={"id": 1}, source={"lsn": 5, "snapshot": marker}))
    assert [c.snapshot for c in decode(value)] == [marker]
    streaming = encode(envelope("c", after={"id": 1}, source={"lsn": 6, "snapshot": False}))
    assert [c.snapshot for c in decode(streaming)] == ["false"]
    assert [c.snapshot for c in decode(encode({"op": "c", "after": {"id": 1}}))] == [None]


def test_unavailable_placeholder_is_removed_and_listed():
    after = {"id": 1, "doc": UNAVAILABLE_VALUE, "n": 2, "blob": UNAVAILABLE_VALUE}
    (change,) = decode(encode(envelope("u", after=after)))
    assert change.row == {"id": 1, "n": 2}
    assert change.unchanged == ("doc", "blob")


def test_truncate_policies():
    value = encode({"before": None, "after": None, "op": "t", "ts_ms": 5, "source": {"lsn": 9}})
    error = decode_error(value)
    assert isinstance(error, RecordRejected) and error.handling == "FAIL"
    assert error.reason.startswith("truncate event (op 't') and truncate_handling is 'fail'")
    (marker,) = decode(value, truncate_handling="truncate", sequence_by=["source.lsn"])
    assert marker == ChangelogRow(Marker.TRUNCATE, None, None, None, None, sequence="[9]")
    assert decode(value, truncate_handling="ignore") == []


def test_primary_key_change_is_a_delete_and_an_insert():
    """d under the old key, its tombstone, c under the new key (another partition)."""
    decoder = ChangelogBatchDecoder(FromChangelogSettings(preset="debezium"), PK)
    old = decoder(kafka_batch([
        (key_bytes(id=1), encode(envelope("d", before={"id": 1, "email": None}))),
        (key_bytes(id=1), None),
    ], partition=0)).to_pylist()
    new = decoder(kafka_batch([(key_bytes(id=2), encode(envelope("c", after={"id": 2, "email": "e"})))],
                              partition=1)).to_pylist()
    assert [(r["partition"], r["kind"], r["key"], r["row"]) for r in old + new] == [
        (0, "-D", "[1]", '{"id":1,"email":null}'), (1, "+I", "[2]", '{"id":2,"email":"e"}'),
    ]


def test_partial_and_full_deletes():
    partial = encode(envelope("d", before={"id": 5, "email": None}))
    assert [c.row for c in decode(partial)] == [{"id": 5, "email": None}]  # passed through as it came
    assert [c.row for c in decode(encode(envelope("d")), key_bytes(id=5))] == [{"id": 5}]
    full = encode(envelope("d", before={"id": 5, "email": "a"}))
    assert [c.row for c in decode(full, consume_full_deletes=True)] == [{"id": 5, "email": "a"}]
    error = decode_error(encode(envelope("d")), key_bytes(id=5), consume_full_deletes=True)
    assert error.reason == (
        "delete event has no 'before' object and consume_full_deletes is set (a full delete needs the row image)"
    )


def test_sequence_and_passthrough_from_the_source_block():
    value = encode(envelope("c", after={"id": 1}, source={"lsn": 77, "snapshot": "false"}, ts_ms=1234))
    (change,) = decode(value, sequence_by=["source.lsn", "ts_ms"], passthrough=["ts_ms", "source.lsn"])
    assert change.sequence == "[77,1234]"
    assert change.row == {"id": 1, "ts_ms": 1234, "source_lsn": 77}


# --- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b'{"op": "c", "after": {"email": "' + SECRET.encode() + b'"', "value is not valid JSON: "),
        (b"\xff\xfe" + SECRET.encode(), "value is not valid JSON: not UTF-8"),
        (encode([SECRET]), "record is not an object (got list)"),
        (encode({"after": SECRET_ROW}), "record has no 'op' field"),
        (encode({"op": None, "after": SECRET_ROW}), "record has a null 'op' field"),
        (encode(envelope("x", after=SECRET_ROW)), "unknown op code 'x'"),
        (encode(envelope("c", before=SECRET_ROW)), "op 'c' event has no 'after' object"),
        (encode(envelope("u", after=[SECRET])), "op 'u' event has no 'after' object"),
        (encode(envelope("r", after={"email": SECRET})), "primary key column 'id' is missing or null in the 'after'"),
        (encode(envelope("c", after={**SECRET_ROW, "id": None})), "primary key column 'id' is missing or null"),
        (encode(envelope("d", before={"email": SECRET})), "primary key column 'id' is missing or null in the 'before'"),
    ],
)
def test_errors_name_the_reason_without_the_payload(value, reason):
    assert decode_error(value).reason.startswith(reason)


def test_invalid_json_reason_has_position_but_no_text():
    error = decode_error(b'{"op": "c", "after": ' + SECRET.encode())
    assert error.reason.startswith("value is not valid JSON: Expecting value: line 1 column")


@pytest.mark.parametrize(
    ("key", "detail"),
    [
        (None, "the Kafka key is null"),
        (SECRET.encode(), "Kafka key is not valid JSON"),
        (json.dumps([SECRET]).encode(), "the Kafka key is not an object"),
    ],
)
def test_delete_without_before_or_usable_key(key, detail):
    error = decode_error(encode(envelope("d")), key)
    assert error.reason.startswith("delete event has no 'before' object and no usable key")
    assert detail in error.reason


def test_delete_with_key_missing_a_primary_key_column():
    error = decode_error(encode(envelope("d")), key_bytes(other=SECRET))
    assert error.reason == "primary key column 'id' is missing or null in the Kafka key"


def test_unusable_schema_block_is_a_decode_error():
    value = json.dumps({"schema": {"type": "string"}, "payload": envelope("c", after={"id": 1})})
    assert decode_error(value.encode()).reason.startswith("schema block is not usable")


# --- batches ---------------------------------------------------------------------------


def test_batch_keeps_errors_as_rows_with_their_bytes_and_drops_tombstones():
    bad_key = b"k\xff" + b"x" * 300
    batch = kafka_batch(
        [
            (key_bytes(id=1), encode(envelope("c", after={"id": 1, "email": "a"}), wrap=True)),
            (key_bytes(id=1), None),
            (bad_key, b"not json " + SECRET.encode()),
            (key_bytes(id=2), encode(envelope("u", before={"id": 2, "email": "a"}, after={"id": 2, "email": "b"}))),
            (None, encode({"op": "m", "message": {}})),
            (key_bytes(id=3), encode(envelope("x", after={"id": 3}))),
        ]
    )
    settings_ = FromChangelogSettings(preset="debezium", invalid_op_handling="DEAD_LETTER")
    decoded = ChangelogBatchDecoder(settings_, PK)(batch)
    assert decoded.schema == CHANGELOG_SCHEMA
    rows = decoded.to_pylist()
    assert [(r["offset"], r["change_index"], r["kind"]) for r in rows] == [
        (10, 0, "+I"), (12, 0, None), (13, 0, "-U"), (13, 1, "+U"), (15, 0, None),
    ]
    assert all(r["topic"] == "t" and r["partition"] == 2 and r["timestamp"] == 1704153600000 for r in rows)
    good, bad, before, after, unknown = rows
    assert (good["key"], good["upsert_key"], good["partition_key"]) == ("[1]", "[1]", "[1]")
    assert good["row"] == '{"id":1,"email":"a"}' and good["types"] == '{"id":"int32","email":"string"}'
    assert good["raw_key"] is good["raw_value"] is good["headers"] is good["error"] is None
    assert (before["row"], after["row"]) == ('{"id":2,"email":"a"}', '{"id":2,"email":"b"}')
    assert (bad["error"].startswith("value is not valid JSON: Expecting value"), bad["handling"], bad["stage"]) == (
        True, "FAIL", "decode"
    )
    assert (bad["raw_key"], bad["raw_value"]) == (bad_key, b"not json " + SECRET.encode())
    assert bad["headers"] == [{"key": "h", "value": b"v"}] and bad["row"] is None and bad["kind"] is None
    assert SECRET not in bad["error"]
    assert (unknown["error"], unknown["handling"], unknown["stage"]) == (
        "unknown op code 'x'", "DEAD_LETTER", "from_changelog"
    )


def test_batch_of_nothing():
    decoded = ChangelogBatchDecoder(FromChangelogSettings(preset="debezium"), PK)(kafka_batch([]))
    assert decoded.num_rows == 0 and decoded.schema == CHANGELOG_SCHEMA


# --- properties ------------------------------------------------------------------------

scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1), st.text(max_size=20), st.booleans()
)
rows = st.dictionaries(st.text(min_size=1, max_size=8), scalars, min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(row=rows, op=st.sampled_from(["c", "r", "u"]), wrap=st.booleans(), data=st.data())
def test_round_trip_of_random_rows(row, op, wrap, data):
    primary_key = tuple(data.draw(st.lists(st.sampled_from(sorted(row)), min_size=1, unique=True)))
    payload = envelope(op, after=row)
    value = json.dumps({"schema": None, "payload": payload} if wrap else payload).encode()
    (change,) = decode(value, None, primary_key)
    assert change.row == {c: v for c, v in row.items() if v != UNAVAILABLE_VALUE}
    assert json.loads(change.key) == [row[column] for column in primary_key]
    assert change.kind is (ChangeKind.UPDATE_AFTER if op == "u" else ChangeKind.INSERT)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(st.integers(), st.text(), st.booleans(), st.floats(allow_nan=False)), max_size=4))
def test_canonical_key_is_canonical_json(values):
    assert canonical_key(values) == canonical_json(values)


ENVELOPE_LIKE_KEYS = ["op", "before", "after", "id", "schema", "payload", "type", "fields", "source"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(ENVELOPE_LIKE_KEYS), children),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(value=json_values, key=json_values, preset=st.sampled_from(["debezium", "flat", "upsert-kafka"]))
def test_arbitrary_json_only_ever_raises_decode_error(value, key, preset):
    try:
        decode(json.dumps(value).encode(), json.dumps(key).encode(), PK, preset=preset)
    except DecodeError:
        pass


# --- pluggable document decoders --------------------------------------------------------

AVRO_ROW = {
    "type": "record", "name": "Row",
    "fields": [{"name": "id", "type": "long"}, {"name": "email", "type": "string"}],
}
AVRO_ENVELOPE = fastavro.parse_schema({
    "type": "record", "name": "Envelope",
    "fields": [
        {"name": "before", "type": ["null", AVRO_ROW], "default": None},
        {"name": "after", "type": ["null", "Row"], "default": None},
        {"name": "op", "type": "string"},
    ],
})


class NotAvro(DecodeError):
    """A decoder's own error type."""


def avro_documents(value: bytes) -> tuple[dict, dict[str, str]]:
    """A document decoder under the pluggable contract: schemaless Avro with a fixed schema."""
    try:
        return fastavro.schemaless_reader(io.BytesIO(value), AVRO_ENVELOPE), {"id": "int64", "email": "string"}
    except (EOFError, ValueError, IndexError) as exc:
        raise NotAvro(f"value is not Avro of the envelope schema ({type(exc).__name__})") from None


def avro(document: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, AVRO_ENVELOPE, document)
    return out.getvalue()


def test_a_pluggable_document_decoder_and_its_errors():
    decoder = ChangelogBatchDecoder(FromChangelogSettings(preset="debezium"), PK, value_decoder=avro_documents)
    batch = kafka_batch([
        (None, avro({"before": None, "after": {"id": 1, "email": "a"}, "op": "c"})),
        (None, b"\x02"),
        (key_bytes(id=1), None),
    ])
    good, bad = decoder(batch).to_pylist()
    assert (good["kind"], good["key"], good["row"], good["types"]) == (
        "+I", "[1]", '{"id":1,"email":"a"}', '{"id":"int64","email":"string"}'
    )
    assert (bad["stage"], bad["handling"], bad["raw_value"]) == ("decode", "FAIL", b"\x02")
    assert bad["error"].startswith("value is not Avro of the envelope schema")


def test_the_batch_decoder_ships_to_executors():
    decoder = ChangelogBatchDecoder(FromChangelogSettings(preset="debezium", passthrough=["ts_ms"]), PK)
    batch = kafka_batch([(None, encode(envelope("c", after={"id": i, "email": "e"}), wrap=True)) for i in range(3)])
    expected = decoder(batch)
    assert pickle.loads(pickle.dumps(decoder))(batch).equals(expected)


def test_flat_records_take_their_types_from_the_top_level_struct():
    schema = {"type": "struct", "fields": [
        {"type": "int64", "field": "id"}, {"type": "string", "field": "name"},
        {"type": "string", "field": "__deleted"},
    ]}
    value = json.dumps({"schema": schema, "payload": {"id": 4, "name": "n", "__deleted": "false"}}).encode()
    settings_ = FromChangelogSettings(preset="deletion-flag")
    (row,) = ChangelogBatchDecoder(settings_, PK)(kafka_batch([(None, value)])).to_pylist()
    assert (row["kind"], row["row"], row["types"]) == ("+U", '{"id":4,"name":"n"}', '{"id":"int64","name":"string"}')


_EDGE_INTEGERS = [2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**18, 10**19 - 1, -(10**18),
                  -(10**19) + 1, 10**19, 1_795_973_736_106_000_000]
_NUMBERS = st.one_of(st.integers(min_value=-(10**21), max_value=10**21), st.sampled_from(_EDGE_INTEGERS),
                     st.floats(allow_nan=False, allow_infinity=False),
                     st.decimals(allow_nan=False, allow_infinity=False, places=19).map(str))
_VALUES = st.recursive(st.one_of(_NUMBERS, st.text(alphabet="-0123456789e.x", max_size=25), st.none()),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                       max_leaves=8)


def _typed(value):
    """A parsed document with every number's type kept (1 and 1.0 compare equal)."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


@settings(max_examples=400, deadline=None)
@given(_VALUES, st.sampled_from([(",", ":"), (", ", ": ")]))
def test_documents_parse_as_the_standard_parser_parses_them(value, separators):
    # Integers from -2**63 to 2**64 - 1 (19-digit nanosecond timestamps included) take the fast parser; beyond
    # them the exact one. Either way the numbers and their types are the standard parser's.
    data = json.dumps(value, separators=separators).encode()
    assert _typed(loads(data)) == _typed(json.loads(data))
