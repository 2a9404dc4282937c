"""Column by column equals row by row for every column type a real Debezium capture lands in, JSON and Avro.

Generated change feeds (hypothesis, derandomised) over a table of the realistic export's types:
decimal(12,2), zoned and naive timestamps (years from 1 on), dates, JSON and UUID text, an enum
as text, array<string> with null items, a long text, doubles, booleans, binaries. Each flush
is encoded both ways, as Debezium JSON and other JSON layouts, and as Confluent Avro through
the tests' registry (Apicurio) with the table's own serializers; the bytes must be equal.
"""

from __future__ import annotations

import io
import json
import uuid
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import fastavro
import pyarrow as pa
import pytest
from deltalake import write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.schema_registry import SchemaRegistryClient
from service.config.exports import ExportSettings
from service.delta_to_kafka.changelog.to_changelog import ToChangelog
from service.delta_to_kafka.formats.avro_fragments import _list_text, varints
from service.delta_to_kafka.formats.avro_serializers import TableAvroSerializer
from service.delta_to_kafka.formats.export_encoder import ExportEncoder
from service.delta_to_kafka.formats.output_formats import EncodeError, KafkaRecordEncoder

NOW = 1_700_000_000.25
T0 = datetime(2024, 5, 1, 12, 0, 0, 250_000, tzinfo=timezone.utc)
SCHEMA = pa.schema([
    ("id", pa.int64()), ("email", pa.string()), ("revision", pa.int32()), ("balance", pa.decimal128(12, 2)),
    ("updated_at", pa.timestamp("us", tz="UTC")), ("local_at", pa.timestamp("us")), ("birthday", pa.date32()),
    ("profile", pa.string()), ("external_id", pa.string()), ("status", pa.string()),
    ("tags", pa.list_(pa.string())), ("notes", pa.string()), ("score", pa.float64()), ("active", pa.bool_()),
    ("blob", pa.binary()),
])
LONG_NOTE = "x" * 2_500 + "é"
TEXT = st.text(st.characters(codec="utf-8"), max_size=12) | st.just(LONG_NOTE)
VALUES = {
    "email": TEXT, "revision": st.integers(-2**31, 2**31 - 1),
    "balance": st.none() | st.decimals(min_value=-10**10 + 1, max_value=10**10 - 1, places=2),
    "updated_at": st.none() | st.datetimes(datetime(1, 1, 1), datetime(9999, 12, 31), timezones=st.just(timezone.utc)),
    "local_at": st.none() | st.datetimes(datetime(1, 1, 1), datetime(9999, 12, 31)),
    "birthday": st.none() | st.dates(date(1, 1, 1), date(9999, 12, 31)),
    "profile": st.none() | st.sampled_from(['{"plan": "pro", "score": 3}', '{"city": "Łódź", "q": "a\\"b"}']),
    "external_id": st.uuids().map(str), "status": st.sampled_from(["new", "active", "suspended", "closed"]),
    "tags": st.none() | st.lists(st.none() | TEXT, max_size=3), "notes": st.none() | TEXT,
    "score": st.none() | st.floats(), "active": st.none() | st.booleans(), "blob": st.none() | st.binary(max_size=5),
}
ROWS = st.fixed_dictionaries(VALUES)
KINDS = st.sampled_from(["insert", "update", "delete"])


@st.composite
def feeds(draw) -> pa.Table:
    """A change feed of 1-3 commits over keys 0-5: inserts, -U/+U pairs and deletes, commit rows in drawn order."""
    live: dict[int, dict] = {}
    rows: list[tuple[str, int, dict]] = []
    for version in range(draw(st.integers(1, 3))):
        commit = []
        for key in draw(st.lists(st.integers(0, 5), unique=True, max_size=6)):
            kind = draw(KINDS)
            if key not in live:
                live[key] = {"id": key, **draw(ROWS)}
                commit.append(("insert", live[key]))
            elif kind == "delete":
                commit.append(("delete", live.pop(key)))
            else:
                new = {"id": key, **draw(ROWS)}
                commit += [("update_preimage", live[key]), ("update_postimage", new)]
                live[key] = new
        rows += [(kind, version, row) for kind, row in draw(st.permutations(commit))]
    data = {c: pa.array([row[c] for _, _, row in rows], SCHEMA.field(c).type) for c in SCHEMA.names}
    data["_change_type"] = pa.array([kind for kind, _, _ in rows], pa.string())
    data["_commit_version"] = pa.array([v for _, v, _ in rows], pa.int64())
    data["_commit_timestamp"] = pa.array([T0 + timedelta(seconds=v) for _, v, _ in rows], pa.timestamp("us"))
    return pa.table(data)


JSON_LAYOUTS = [
    {"preset": "debezium"},
    {"preset": "debezium", "passthrough": ["_commit_timestamp", "tags"], "produces_full_deletes": False},
    {"preset": "flat", "passthrough": ["_commit_timestamp"]},
    {"before": "b", "after": "a", "passthrough": ["balance", "_commit_version"], "compaction": "none"},
]
AVRO_LAYOUTS = [
    {"preset": "debezium"},
    {"preset": "debezium", "passthrough": ["_commit_timestamp", "balance"], "produces_full_deletes": False},
    {"preset": "flat", "passthrough": ["_commit_version"]},
    {"before": "b", "after": "a", "passthrough": ["tags", "_commit_timestamp"], "compaction": "none"},
]
HYPOTHESIS = settings(derandomize=True, max_examples=25, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _both_ways(settings_: ExportSettings, feed: pa.Table, key=None, value=None) -> None:
    encoder = ExportEncoder(settings_, key, value, clock=lambda: NOW)
    columnar = encoder._by_column(feed, int(NOW * 1000))
    if feed.num_rows:
        assert columnar is not None  # a stateless flush: the column path was taken
    rows = KafkaRecordEncoder(settings_, key, value).encode(ToChangelog(settings_).encode_flush(feed, NOW),
                                                            int(NOW * 1000))
    assert columnar == rows


@pytest.mark.parametrize("layout", JSON_LAYOUTS, ids=[str(i) for i in range(len(JSON_LAYOUTS))])
@HYPOTHESIS
@given(feed=feeds())
def test_json_column_by_column_equals_row_by_row(layout, feed):
    _both_ways(ExportSettings(name="e", table="t", topic="t.changes", primary_key=("id",), **layout), feed)


@pytest.fixture(scope="module")
def table_uri(tmp_path_factory) -> str:
    uri = str(tmp_path_factory.mktemp("realistic") / "accounts")
    write_deltalake(uri, SCHEMA.empty_table())
    return uri


@pytest.mark.parametrize("layout", AVRO_LAYOUTS, ids=[str(i) for i in range(len(AVRO_LAYOUTS))])
def test_avro_column_by_column_equals_row_by_row(layout, table_uri, apicurio_registry_url):
    export = ExportSettings(name="e", table="accounts", topic=f"accounts.{uuid.uuid4().hex[:8]}", primary_key=("id",),
                            format="avro-confluent", schema_registry_url=apicurio_registry_url, **layout)
    client = SchemaRegistryClient(apicurio_registry_url)
    key, value = (TableAvroSerializer(export, table_uri, {}, role, client) for role in ("key", "value"))

    @HYPOTHESIS
    @given(feed=feeds())
    def check(feed):
        if "_commit_version" in layout.get("passthrough", ()):  # delta-rs reads it as uint64
            feed = feed.set_column(feed.schema.get_field_index("_commit_version"), "_commit_version",
                                   feed.column("_commit_version").cast(pa.uint64()))
        _both_ways(export, feed, key, value)

    check()


def test_varints_are_avro_zigzag_longs():
    numbers = [0, -1, 1, 63, -64, 64, 2**31 - 1, -2**31, 2**63 - 1, -2**63, 300, -301]
    expected = []
    for number in numbers:
        stream = io.BytesIO()
        fastavro.schemaless_writer(stream, "long", number)
        expected.append(stream.getvalue())
    assert varints(pa.array(numbers, pa.int64()).to_numpy()).to_pylist() == expected


def test_list_text_is_the_row_paths_json_dumps_of_a_sliced_list_column():
    lists = [["a", None], None, [], ["größe", "🏷", "o'neil", 'q"\\\n'], ["a"], None, ["\u2028", "x" * 300]]
    column = pa.array([["skipped"], *lists], pa.list_(pa.string())).slice(1)
    pieces = _list_text("string", column)  # a null list's text is "[]": its union tag leaves it out
    assert pieces is not None
    joined = pa.array([b"".join(p[i].as_py() or b"" for p in pieces) for i in range(len(column))])
    expected = []
    for value in lists:
        stream = io.BytesIO()
        fastavro.schemaless_writer(stream, "string", json.dumps([] if value is None else value, separators=(",", ":")))
        expected.append(stream.getvalue())
    assert joined.to_pylist() == expected


def test_a_decimal_beyond_the_schema_takes_the_row_path(table_uri, apicurio_registry_url):
    export = ExportSettings(name="e", table="accounts", topic=f"accounts.{uuid.uuid4().hex[:8]}", primary_key=("id",),
                            format="avro-confluent", schema_registry_url=apicurio_registry_url, preset="debezium")
    client = SchemaRegistryClient(apicurio_registry_url)
    key, value = (TableAvroSerializer(export, table_uri, {}, role, client) for role in ("key", "value"))
    row = {c: None for c in SCHEMA.names} | {"id": 1, "email": "a", "revision": 1, "external_id": "u", "status": "new"}
    data = {c: pa.array([row[c]], SCHEMA.field(c).type) for c in SCHEMA.names}
    data["balance"] = pa.array([Decimal("100000000000.00")], pa.decimal128(14, 2))  # 14 digits, the schema 12
    data.update({"_change_type": pa.array(["insert"]), "_commit_version": pa.array([0], pa.int64()),
                 "_commit_timestamp": pa.array([T0], pa.timestamp("us"))})
    feed = pa.table(data)
    encoder = ExportEncoder(export, key, value, clock=lambda: NOW)
    assert encoder._by_column(feed, int(NOW * 1000)) is None
    with pytest.raises(EncodeError, match="balance"):  # the row path names the field
        encoder(feed)
