"""Debezium JSON decoding: envelopes, ops, errors as data, no payload in error messages."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.changes import ChangeKind
from service.errors import DecodeError
from service.kafka_to_delta.debezium_json import (
    DECODED_SCHEMA,
    UNAVAILABLE_VALUE,
    DecodedChange,
    decode_batch,
    decode_debezium,
)

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
ENVELOPE_SCHEMA = {
    "type": "struct",
    "name": "dbserver1.inventory.customers.Envelope",
    "fields": [
        {**ROW_SCHEMA, "field": "before"},
        {**ROW_SCHEMA, "field": "after"},
        {"type": "struct", "fields": [], "field": "source"},
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


def decode_error(value, key=None, primary_key=PK) -> DecodeError:
    with pytest.raises(DecodeError) as caught:
        decode_debezium(value, key, primary_key)
    assert SECRET not in str(caught.value)
    return caught.value


# --- envelopes and ops -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "kind"),
    [("c", ChangeKind.INSERT), ("r", ChangeKind.INSERT), ("u", ChangeKind.UPDATE_AFTER)],
)
@pytest.mark.parametrize("wrap", [False, True])
def test_upserting_ops_give_the_after_image(op, kind, wrap):
    after = {"id": 7, "email": "a@x"}
    before = {"id": 7, "email": "old@x"} if op == "u" else None
    change = decode_debezium(encode(envelope(op, before, after), wrap), None, PK)
    expected_types = {"id": "int32", "email": "string"} if wrap else None
    assert change == DecodedChange(kind, "[7]", after, expected_types)


@pytest.mark.parametrize("wrap", [False, True])
def test_delete_keeps_only_primary_key_columns_of_before(wrap):
    value = encode(envelope("d", before={"id": 7, "email": "a@x"}), wrap)
    change = decode_debezium(value, None, PK)
    assert change.kind is ChangeKind.DELETE
    assert change.key == "[7]"
    assert change.row == {"id": 7}


@pytest.mark.parametrize("wrap_key", [False, True])
def test_delete_without_before_takes_the_kafka_key(wrap_key):
    key = key_bytes(wrap=wrap_key, id=7)
    change = decode_debezium(encode(envelope("d")), key, PK)
    assert change == DecodedChange(ChangeKind.DELETE, "[7]", {"id": 7}, None)


def test_composite_key_follows_primary_key_order():
    after = {"n": 3, "name": "a", "x": True}
    change = decode_debezium(encode(envelope("c", after=after)), None, ("name", "n"))
    assert change.key == '["a",3]'
    deleted = decode_debezium(encode(envelope("d")), key_bytes(n=3, name="a"), ("name", "n"))
    assert deleted.key == '["a",3]'
    assert list(deleted.row) == ["name", "n"]


def test_json_number_types_and_placeholder_are_kept():
    after = {"id": 1, "i": 10, "f": 10.0, "big": 2**70, "toast": UNAVAILABLE_VALUE}
    change = decode_debezium(encode(envelope("u", after=after)), None, PK)
    assert change.row == after
    assert type(change.row["i"]) is int and type(change.row["f"]) is float


@pytest.mark.parametrize("value", [None, encode({"schema": ENVELOPE_SCHEMA, "payload": None})])
def test_tombstones_decode_to_nothing(value):
    assert decode_debezium(value, key_bytes(id=7), PK) is None


@pytest.mark.parametrize("wrap", [False, True])
def test_logical_messages_decode_to_nothing(wrap):
    message = {"op": "m", "ts_ms": 1, "message": {"prefix": "p", "content": SECRET}}
    assert decode_debezium(encode(message, wrap), None, PK) is None


# --- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b'{"op": "c", "after": {"email": "' + SECRET.encode() + b'"', "value is not valid JSON: "),
        (b"\xff\xfe" + SECRET.encode(), "value is not valid JSON: not UTF-8"),
        (encode([SECRET]), "envelope is not an object (got list)"),
        (encode({"after": SECRET_ROW}), "envelope has no 'op' field"),
        (encode({"op": None, "after": SECRET_ROW}), "envelope has a null 'op' field"),
        (encode(envelope("x", after=SECRET_ROW)), "unknown op code 'x'"),
        (encode(envelope("t")), "truncate events are not supported yet"),
        (encode(envelope("c", before=SECRET_ROW)), "op 'c' event has no 'after' object"),
        (encode(envelope("u", after=[SECRET])), "op 'u' event has no 'after' object"),
        (encode(envelope("r", after={"email": SECRET})), "primary key column 'id' is missing"),
        (encode(envelope("c", after={**SECRET_ROW, "id": None})), "primary key column 'id' is"),
        (encode(envelope("d", before={"email": SECRET})), "primary key column 'id' is missing"),
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

KAFKA_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)


def kafka_batch(records: list[tuple[bytes | None, bytes | None]]) -> pa.RecordBatch:
    now = datetime(2024, 1, 2, tzinfo=timezone.utc)
    return pa.RecordBatch.from_pydict(
        {
            "key": [key for key, _ in records],
            "value": [value for _, value in records],
            "topic": ["t"] * len(records),
            "partition": [2] * len(records),
            "offset": list(range(10, 10 + len(records))),
            "timestamp": [now] * len(records),
            "headers": [[{"key": "h", "value": b"v"}]] * len(records),
        },
        schema=KAFKA_SCHEMA,
    )


def test_decode_batch_keeps_errors_as_rows_and_drops_tombstones():
    batch = kafka_batch(
        [
            (key_bytes(id=1), encode(envelope("c", after={"id": 1, "email": "a"}), wrap=True)),
            (key_bytes(id=1), None),
            (b"k\xff" + b"x" * 300, b"not json " + SECRET.encode()),
            (key_bytes(id=2), encode(envelope("d", before={"id": 2, "email": "b"}))),
            (None, encode({"op": "m", "message": {}})),
        ]
    )
    decoded = decode_batch(batch, PK)
    assert decoded.schema == DECODED_SCHEMA
    rows = decoded.to_pylist()
    assert [row["offset"] for row in rows] == [10, 12, 13]
    assert all(row["topic"] == "t" and row["partition"] == 2 for row in rows)
    good, bad, deleted = rows
    assert (good["kind"], good["key"], good["error"]) == ("+I", "[1]", None)
    assert good["row"] == '{"id":1,"email":"a"}'
    assert good["types"] == '{"id":"int32","email":"string"}'
    assert bad["kind"] is None and bad["row"] is None and bad["types"] is None
    assert bad["key"] == ("k\ufffd" + "x" * 300)[:200]
    assert bad["error"].startswith("value is not valid JSON: Expecting value")
    assert SECRET not in bad["error"]
    assert (deleted["kind"], deleted["key"], deleted["row"], deleted["types"]) == (
        "-D",
        "[2]",
        '{"id":2}',
        None,
    )


def test_decode_batch_of_nothing():
    assert decode_batch(kafka_batch([]), PK).num_rows == 0


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
    change = decode_debezium(value, None, primary_key)
    assert change.row == row
    assert json.loads(change.key) == [row[column] for column in primary_key]
    assert change.kind is (ChangeKind.UPDATE_AFTER if op == "u" else ChangeKind.INSERT)


ENVELOPE_LIKE_KEYS = ["op", "before", "after", "id", "schema", "payload", "type", "fields"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(ENVELOPE_LIKE_KEYS), children),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(value=json_values, key=json_values)
def test_arbitrary_json_only_ever_raises_decode_error(value, key):
    try:
        decode_debezium(json.dumps(value).encode(), json.dumps(key).encode(), PK)
    except DecodeError:
        pass
