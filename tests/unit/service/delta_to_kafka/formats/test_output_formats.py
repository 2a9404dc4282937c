"""Record layouts and exact JSON: Debezium envelopes, flat and deletion-flag records, keys,
tombstones, headers, and values that read back to the very column values they came from.

Registry: the one Avro test registers and decodes through Apicurio Registry's ccompat API
(`apicurio_registry_url`, started once per run on first use)."""

from __future__ import annotations

import math
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest

from connectors.delta.arrow_types import rows_to_table
from connectors.schema_registry import (
    ConfluentAvroDecoder,
    ConfluentAvroEncoder,
    SchemaRegistryClient,
)
from connectors.schema_registry.avro_types import avro_schema_for, debezium_envelope_schema
from service.config.exports import ExportSettings
from service.delta_to_kafka.changelog.to_changelog import OutputRecord, ToChangelog
from service.delta_to_kafka.formats.export_encoder import ExportEncoder
from service.delta_to_kafka.formats.output_formats import (
    EncodeError,
    Header,
    JsonSerializer,
    KafkaRecordEncoder,
    json_ready,
    value_document,
)
from service.kafka_to_delta.formats.debezium_json import json_key, loads
from vocabulary.errors import ConfigError

COMMIT_TS = datetime(2024, 5, 1, 12, 0, 0, 250_000, tzinfo=timezone.utc)


def export(**fields) -> ExportSettings:
    return ExportSettings(**{"name": "customers-out", "table": "customers", "topic": "lake.customers",
                             "primary_key": ("id",), **fields})


def record(value: dict | None, op: str | None = "c", key: dict | None = None, version: int = 7) -> OutputRecord:
    return OutputRecord(key or {"id": 5}, value, op, version, COMMIT_TS, 0)


@pytest.mark.parametrize("value, expected", [
    (2**63 - 1, 2**63 - 1),
    (2**64 - 1, 2**64 - 1),
    (-(2**63), -(2**63)),
    (True, True),
    (0.1, 0.1),
    (math.inf, "Infinity"),
    (-math.inf, "-Infinity"),
    (Decimal("12.30"), "12.30"),
    (Decimal("0E-10"), "0.0000000000"),
    (Decimal("-1.5E+3"), "-1500"),
    (datetime(2024, 5, 1, 14, 0, 0, 1, tzinfo=ZoneInfo("Europe/Berlin")), "2024-05-01T12:00:00.000001Z"),
    (datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc), "2024-05-01T12:00:00.000000Z"),
    (datetime(2024, 5, 1, 12, 0, 0, 5), "2024-05-01T12:00:00.000005"),
    (date(2024, 2, 29), "2024-02-29"),
    (time(23, 59, 1, 7), "23:59:01.000007"),
    (timedelta(seconds=1, microseconds=3), 1_000_003),
    (b"\x00\xffhi", "AP9oaQ=="),
    ({"inner": [1, None, Decimal("1.0")]}, {"inner": [1, None, "1.0"]}),
    ([("k", 1), ("j", 2)], [["k", 1], ["j", 2]]),  # map entries as arrow gives them
])
def test_json_ready_is_exact(value, expected):
    assert json_ready(value) == expected
    assert loads(JsonSerializer().encode({"v": value})) == {"v": expected}


def test_nan_becomes_text():
    assert json_ready(math.nan) == "NaN"


def test_value_without_a_json_form_fails_naming_export_version_key_and_field():
    encoder = KafkaRecordEncoder(export())
    shown_key = r"<redacted #[0-9a-f]{12}>"  # the key value is personal data (log_values: false)
    with pytest.raises(EncodeError, match=rf"export 'customers-out' commit version 7 key {shown_key}: field 'blob'"):
        encoder.encode([record({"op": "INSERT", "id": 5, "blob": object()})], processed_at_ms=0)


def test_debezium_envelope_layout_key_and_headers():
    settings = export(preset="debezium", passthrough="_commit_version")
    value = {"op": "u", "_commit_version": 7, "before": {"id": 5, "n": 1}, "after": {"id": 5, "n": 2}}
    (kafka,) = KafkaRecordEncoder(settings).encode([record(value, "u")], processed_at_ms=1_700_000_000_123)
    assert kafka.key == b'{"id":5}'
    assert kafka.value == (
        b'{"before":{"id":5,"n":1},"after":{"id":5,"n":2},"source":{"connector":"cdc-lakehouse",'
        b'"name":"customers-out","table":"customers","version":7,"ts_ms":1714564800250},"op":"u",'
        b'"ts_ms":1700000000123,"_commit_version":7}'
    )
    assert kafka.headers == [(Header.TABLE, b"customers"), (Header.COMMIT_VERSION, b"7")]
    assert json_key(kafka.key) == ({"id": 5}, None)  # what the FROM side reads a partial delete's key from


def test_tombstone_has_a_key_and_no_value():
    (kafka,) = KafkaRecordEncoder(export(preset="debezium")).encode([record(None, None)], processed_at_ms=0)
    assert (kafka.key, kafka.value) == (b'{"id":5}', None)


def test_flat_and_deletion_flag_records_are_the_value_as_it_is():
    flat = {"op": "DELETE", "id": 5}
    assert KafkaRecordEncoder(export()).encode([record(flat, "DELETE")], 0)[0].value == b'{"op":"DELETE","id":5}'
    flag = {"__deleted": "true", "id": 5, "name": "A"}
    out = KafkaRecordEncoder(export(preset="deletion-flag")).encode([record(flag, "true")], 0)
    assert loads(out[0].value) == flag
    assert value_document(record(flag, "true"), export(preset="deletion-flag"), 99) is flag


def test_composite_key_keeps_primary_key_order():
    out = KafkaRecordEncoder(export(primary_key=("tenant", "id"))).encode(
        [record({"op": "INSERT", "tenant": "t1", "id": 5}, key={"tenant": "t1", "id": 5})], 0)
    assert out[0].key == b'{"tenant":"t1","id":5}'


TYPED = pa.schema([
    ("id", pa.int64()), ("big", pa.uint64()), ("f", pa.float64()), ("flag", pa.bool_()), ("s", pa.string()),
    ("blob", pa.binary()), ("day", pa.date32()), ("at", pa.timestamp("us", tz="UTC")), ("local", pa.timestamp("us")),
    ("amount", pa.decimal128(12, 3)), ("tags", pa.list_(pa.int32())), ("addr", pa.struct([("city", pa.string())])),
])
TYPE_NAMES = {"id": "int64", "f": "float64", "flag": "bool", "s": "string", "blob": "binary", "day": "date32",
              "at": "timestamp_us_utc", "local": "timestamp_us"}


def _typed_feed() -> pa.Table:
    rows = [
        {"id": 2**63 - 1, "big": 2**64 - 1, "f": -0.1, "flag": True, "s": "Zoë ✓", "blob": b"\x00\x01\xfe",
         "day": date(1969, 12, 31), "at": datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=timezone.utc),
         "local": datetime(1999, 12, 31, 23, 59, 59, 999999), "amount": Decimal("-123456789.120"),
         "tags": [1, None, 3], "addr": {"city": "Köln"}},
        {"id": -1, **{name: None for name in TYPED.names if name != "id"}},
    ]
    table = pa.Table.from_pylist(rows, schema=TYPED)
    meta = {"_change_type": pa.array(["insert"] * 2), "_commit_version": pa.array([3, 3], pa.uint64()),
            "_commit_timestamp": pa.array([COMMIT_TS.replace(tzinfo=None)] * 2, pa.timestamp("ms"))}
    for name, column in meta.items():
        table = table.append_column(name, column)
    return table


def test_json_values_read_back_to_the_same_column_values():
    feed = _typed_feed()
    records = ToChangelog(export(preset="flat")).encode_flush(feed, 0)
    documents = [loads(kafka.value) for kafka in KafkaRecordEncoder(export(preset="flat")).encode(records, 0)]
    rebuilt = rows_to_table(documents, TYPE_NAMES)
    for name in TYPE_NAMES:
        assert rebuilt.column(name).to_pylist() == feed.column(name).to_pylist(), name
    first = documents[0]
    assert first["big"] == 2**64 - 1 and first["amount"] == "-123456789.120"
    assert Decimal(first["amount"]) == feed.column("amount")[0].as_py()
    assert first["tags"] == [1, None, 3] and first["addr"] == {"city": "Köln"}
    assert first["at"] == "2024-05-01T12:00:00.123456Z"


def test_avro_confluent_needs_serializers():
    settings = export(preset="debezium", format="avro-confluent", schema_registry_url="http://registry:8081")
    assert settings.debezium_envelope
    with pytest.raises(ConfigError, match="avro-confluent needs a key and a value serializer"):
        KafkaRecordEncoder(settings)


def test_avro_confluent_envelopes_through_the_schema_registry_encoder(apicurio_registry_url):
    settings = export(preset="debezium", format="avro-confluent", schema_registry_url=apicurio_registry_url)
    columns = {"id": "int64", "at": "timestamp_us_utc", "amount": "decimal(12,3)"}
    source = {"connector": "string", "name": "string", "table": "string", "version": "int64", "ts_ms": "int64"}
    client = SchemaRegistryClient(apicurio_registry_url)
    key_encoder = ConfluentAvroEncoder(client, f"{settings.topic}-key",
                                       avro_schema_for("Key", {"id": "int64"}, namespace="lake.customers",
                                                       required=("id",)))
    value_encoder = ConfluentAvroEncoder(client, f"{settings.topic}-value",
                                         debezium_envelope_schema("lake.customers", columns, source=source))
    encoder = KafkaRecordEncoder(settings, key_serializer=key_encoder, value_serializer=value_encoder)
    row = {"id": 5, "at": datetime(2024, 5, 1, 12, 0, 0, 7, tzinfo=timezone.utc), "amount": Decimal("1.250")}
    (kafka, tombstone) = encoder.encode([record({"op": "c", "before": None, "after": row}), record(None, None)], 42)
    assert tombstone.value is None
    document, _ = ConfluentAvroDecoder(client).decode(kafka.value)
    assert document["op"] == "c" and document["ts_ms"] == 42 and document["before"] is None
    assert document["source"] == {"connector": "cdc-lakehouse", "name": "customers-out", "table": "customers",
                                  "version": 7, "ts_ms": 1714564800250}
    after = rows_to_table([document["after"]], columns).to_pylist()[0]
    assert after == row
    key, _ = ConfluentAvroDecoder(client).decode(kafka.key)
    assert key == {"id": 5}


def _conformed_feed(change_type: str, version: int, row: dict) -> pa.Table:
    """A one-row feed in the schema the change-feed source hands over (int64 version, UTC timestamp)."""
    return pa.table({**{k: [v] for k, v in row.items()}, "_change_type": [change_type],
                     "_commit_version": pa.array([version], pa.int64()),
                     "_commit_timestamp": pa.array([COMMIT_TS], pa.timestamp("us", tz="UTC"))})


def test_export_encoder_is_the_pipelines_encoder_and_state():
    settings = export(preset="debezium", state_ttl_seconds=60)
    first = ExportEncoder(settings, clock=lambda: 1000.5)
    assert first(_conformed_feed("update_preimage", 3, {"id": 5, "n": 1})) == []  # -U waits in state
    second = ExportEncoder(settings, clock=lambda: 1030.0)
    second.restore(first.snapshot())
    (kafka,) = second(_conformed_feed("update_postimage", 4, {"id": 5, "n": 2}))
    envelope = loads(kafka.value)
    assert (envelope["op"], envelope["before"], envelope["after"]) == ("u", {"id": 5, "n": 1}, {"id": 5, "n": 2})
    assert envelope["ts_ms"] == 1_030_000 and envelope["source"]["ts_ms"] == 1714564800250
    key, value, headers = kafka  # the (key, value, headers) tuple the transactional producer takes
    assert key == b'{"id":5}' and headers[1] == (Header.COMMIT_VERSION, b"4")
    second.restore(None)
    (insert,) = second(_conformed_feed("update_postimage", 5, {"id": 5, "n": 3}))
    assert loads(insert.value)["op"] == "c"  # no before image any more: written as an insert (spec 4.3.3)
