"""FROM_CHANGELOG: every example and use case of spec 4.1, fed as Kafka records, checked against
the changelog the spec shows (plus 4.3.5 and the record-level error policies)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from connectors.kafka.range_reader import RAW_SCHEMA
from service.config.from_changelog import FromChangelogSettings
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder
from service.kafka_to_delta.changelog.event_time_order import EventTimeOrder
from service.kafka_to_delta.changelog.from_changelog import FromChangelog, event_time_ms
from service.kafka_to_delta.changelog.upsert_unzip import UpsertUnzip
from vocabulary.errors import ConfigError

DEBEZIUM_UPSERT = {"c, r": "INSERT", "d": "DELETE", "u": "UPDATE_AFTER"}
DEBEZIUM_RETRACT = {"c, r": "INSERT", "d": "DELETE", "u": "UPDATE_BEFORE, UPDATE_AFTER"}


def ms(clock: str) -> int:
    """Epoch ms of a wall-clock time on 2024-01-01 ('14:03')."""
    hours, minutes = clock.split(":")
    return int(datetime(2024, 1, 1, int(hours), int(minutes), tzinfo=timezone.utc).timestamp() * 1000)


class FakeClock:
    def __init__(self, clock: str = "00:00") -> None:
        self.set(clock)

    def set(self, clock: str) -> None:
        self.now = ms(clock) / 1000

    def __call__(self) -> float:
        return self.now


def kafka_batch(values: list, keys: list | None = None) -> pa.RecordBatch:
    encoded = [None if v is None else json.dumps(v).encode() for v in values]
    return pa.RecordBatch.from_pydict(
        {
            "key": keys or [None] * len(values),
            "value": encoded,
            "topic": ["cdc"] * len(values),
            "partition": [0] * len(values),
            "offset": list(range(len(values))),
            "timestamp": [None] * len(values),
            "headers": [None] * len(values),
        },
        schema=RAW_SCHEMA,
    )


class Stream:
    """Kafka records -> stateless FROM_CHANGELOG -> (with state_ttl_seconds) the previous-image stage."""

    def __init__(self, primary_key=("id",), upsert_key=None, clock=None, **params) -> None:
        self.settings = FromChangelogSettings(**params)
        self.decoder = ChangelogBatchDecoder(self.settings, primary_key, upsert_key)
        ttl = self.settings.state_ttl_seconds
        self.unzip = None if ttl is None else UpsertUnzip(ttl, clock or FakeClock())
        self.states: dict[str, str] = {}

    def rows(self, *values, keys=None) -> list[dict]:
        """Changelog rows (CHANGELOG_SCHEMA dicts) of records with these JSON values."""
        rows = self.decoder(kafka_batch(list(values), keys)).to_pylist()
        assert [r["error"] for r in rows if r["error"]] == []
        if self.unzip is None:
            return rows
        out = []
        for row in rows:
            step = self.unzip.apply(self.states.get(row["partition_key"]), [row])
            self._keep(row["partition_key"], step.state)
            out += step.rows
        return out

    def _keep(self, key: str, state: str | None) -> None:
        if state is None:
            self.states.pop(key, None)
        else:
            self.states[key] = state

    def feed(self, *values, keys=None) -> list[tuple]:
        """(kind, row) pairs of the changelog, as the spec writes them."""
        return changes(self.rows(*values, keys=keys))


def changes(rows: list[dict]) -> list[tuple]:
    return [(r["kind"], json.loads(r["row"])) for r in rows]


def table(changelog: list[tuple], key=("id",)) -> list[dict]:
    """The table a changelog leaves (retractions remove, +I/+U set), sorted by key."""
    current: dict = {}
    for kind, row in changelog:
        k = tuple(row[c] for c in key)
        if kind in ("-U", "-D"):
            current.pop(k, None)
        else:
            current[k] = row
    return [current[k] for k in sorted(current)]


# --- 4.1.1 / 4.1.2.1 operation mapping ------------------------------------------------------------


def test_4_1_1_default_signature():
    changelog = Stream().feed({"op": "INSERT", "id": 5, "name": "name"}, {"op": "DELETE", "id": 5, "name": "name"})
    assert changelog == [("+I", {"id": 5, "name": "name"}), ("-D", {"id": 5, "name": "name"})]
    assert table(changelog) == []


def test_4_1_2_1_1_flat_records_with_custom_header():
    changelog = Stream(op="type").feed({"type": "INSERT", "id": 5, "name": "name"},
                                       {"type": "DELETE", "id": 5, "name": "name"})
    assert changelog == [("+I", {"id": 5, "name": "name"}), ("-D", {"id": 5, "name": "name"})]
    assert table(changelog) == []


def test_4_1_2_1_2_mapping_u_to_a_retract_stream():
    stream = Stream(before="before", after="after", op_mapping={"u": "UPDATE_BEFORE, UPDATE_AFTER"})
    changelog = stream.feed({"op": "u", "before": {"id": 5, "name": "old"}, "after": {"id": 5, "name": "new"}})
    assert changelog == [("-U", {"id": 5, "name": "old"}), ("+U", {"id": 5, "name": "new"})]
    assert table(changelog) == [{"id": 5, "name": "new"}]


# --- 4.1.2.2 partitioning, out of orderness, state -------------------------------------------------


def timed(name: str, ident: int, clock: str, op: str = "INSERT") -> dict:
    return {"op": op, "id": ident, "name": name, "event_time": f"2024-01-01T{clock}:00Z"}


def ordered_stream(**params) -> Stream:
    return Stream(order_by="event_time", watermark_delay_seconds=300, **params)


def test_4_1_2_2_1_ordering_with_watermarks_and_late_records():
    stream = ordered_stream()
    order = EventTimeOrder(delay_seconds=300, watermark_ms=ms("10:00"))
    a = order.push(stream.rows(timed("A", 6, "10:05")))
    assert (a.released, a.dropped) == ([], 0)  # buffered until the watermark passes 10:05
    b = order.push(stream.rows(timed("B", 5, "09:55")))
    assert (b.released, b.dropped, order.watermark.current_ms) == ([], 1, ms("10:00"))  # 09:55 < 10:00
    c = order.push(stream.rows(timed("C", 7, "10:11")))
    assert order.watermark.current_ms == ms("10:06")
    assert [(kind, row["name"]) for kind, row in changes(c.released)] == [("+I", "A")]
    assert list(order.states) == ["[7]"]  # C buffered


def test_4_1_2_2_1_late_records_can_be_dead_lettered():
    stream = ordered_stream(late_handling="dead_letter")
    order = EventTimeOrder(300, stream.settings.late_handling, watermark_ms=ms("10:00"))
    step = order.push(stream.rows(timed("B", 5, "09:55")))
    (late,) = step.late
    assert (late["error"], late["handling"], late["stage"]) == (
        "late record: event time 300000 ms behind the watermark", "DEAD_LETTER", "from_changelog"
    )
    assert (late["offset"], json.loads(late["row"])["name"], step.dropped) == (0, "B", 0)


def test_4_1_2_2_2_single_upsert_delete_event_into_all_four_kinds():
    clock = FakeClock("14:00")
    stream = Stream(state_ttl_seconds=300, clock=clock,
                    op_mapping={"upsert": "INSERT, UPDATE_BEFORE, UPDATE_AFTER", "delete": "DELETE"})

    def state() -> tuple:
        previous = stream.unzip.previous(stream.states.get("[99]"))
        return None if previous is None else (json.loads(previous["row"]), previous["expires_at_ms"])

    assert stream.feed({"op": "upsert", "id": 99, "name": "Orphan"}) == [("+I", {"id": 99, "name": "Orphan"})]
    assert state() == ({"id": 99, "name": "Orphan"}, ms("14:05"))
    clock.set("14:03")
    assert stream.feed({"op": "upsert", "id": 99, "name": "Orphan Updated"}) == [
        ("-U", {"id": 99, "name": "Orphan"}), ("+U", {"id": 99, "name": "Orphan Updated"}),
    ]
    assert state() == ({"id": 99, "name": "Orphan Updated"}, ms("14:08"))
    clock.set("14:05")
    assert stream.feed({"op": "delete", "id": 99, "name": "Orphan Updated"}) == [
        ("-D", {"id": 99, "name": "Orphan Updated"})
    ]
    assert state() is None and "[99]" not in stream.states  # cleared
    clock.set("14:10")
    assert stream.feed({"op": "upsert", "id": 99, "name": "Resurrected"}) == [("+I", {"id": 99, "name": "Resurrected"})]
    assert state() == ({"id": 99, "name": "Resurrected"}, ms("14:15"))
    clock.set("15:00")
    assert state() is None  # expired by TTL (processing time)
    assert stream.unzip.expires_at_ms(stream.states["[99]"]) == ms("14:15")  # a timer clears it
    assert stream.feed({"op": "upsert", "id": 99, "name": "Again"}) == [("+I", {"id": 99, "name": "Again"})]


def test_4_1_2_2_3_watermarks_with_multiple_out_of_order_updates():
    stream = ordered_stream()
    order = EventTimeOrder(delay_seconds=300)
    sort_state = []
    for record, watermark in [
        (timed("A", 5, "09:55"), "09:50"),
        (timed("Updated A", 5, "09:57", "UPDATE_AFTER"), "09:52"),
        (timed("Between updates A", 5, "09:56", "UPDATE_AFTER"), "09:52"),
    ]:
        assert order.push(stream.rows(record)).released == []
        assert order.watermark.current_ms == ms(watermark)
        sort_state = sorted(json.loads(order.states["[5]"]), key=lambda r: r["event_time"])
    assert [(r["kind"], json.loads(r["row"])["name"]) for r in sort_state] == [
        ("+I", "A"), ("+U", "Between updates A"), ("+U", "Updated A"),
    ]
    emitted = order.push(stream.rows(timed("B", 6, "10:20")))
    assert order.watermark.current_ms == ms("10:15") and list(order.states) == ["[6]"]
    assert [(kind, row["id"], row["name"]) for kind, row in changes(emitted.released)] == [("+I", 5, "Updated A")]
    uncompacted = EventTimeOrder(delay_seconds=300, compacted=False)
    for record in (timed("A", 5, "09:55"), timed("Updated A", 5, "09:57", "UPDATE_AFTER"),
                   timed("Between updates A", 5, "09:56", "UPDATE_AFTER")):
        uncompacted.push(stream.rows(record))
    assert [row["name"] for _, row in changes(uncompacted.push(stream.rows(timed("B", 6, "10:20"))).released)] == [
        "A", "Between updates A", "Updated A"
    ]


def test_4_1_2_2_3_without_order_by_arrival_order_wins():
    """Without ORDER BY the changes leave in arrival order and the table ends on the stale update."""
    changelog = Stream().feed(timed("A", 5, "09:55"), timed("Updated A", 5, "09:57", "UPDATE_AFTER"),
                              timed("Between updates A", 5, "09:56", "UPDATE_AFTER"), timed("B", 6, "10:20"))
    assert [(kind, row["name"]) for kind, row in changelog] == [
        ("+I", "A"), ("+U", "Updated A"), ("+U", "Between updates A"), ("+I", "B"),
    ]
    assert [row["name"] for row in table(changelog)] == ["Between updates A", "B"]


# --- 4.1.2.3 delete handling / 4.1.2.4 passthrough ------------------------------------------------


def test_4_1_2_3_1_consuming_partial_deletes():
    assert Stream(op_mapping=DEBEZIUM_UPSERT).feed({"op": "d", "id": 5}) == [("-D", {"id": 5})]


def test_4_1_2_3_2_consuming_full_deletes():
    stream = Stream(consume_full_deletes=True, op_mapping=DEBEZIUM_UPSERT)
    assert stream.feed({"op": "d", "id": 5, "name": "Alice", "age": 30}) == [
        ("-D", {"id": 5, "name": "Alice", "age": 30})
    ]


def test_4_1_2_4_1_preserving_debezium_envelope_metadata():
    stream = Stream(before="before", after="after", passthrough=["ts_ms"], op_mapping=DEBEZIUM_UPSERT)
    changelog = stream.feed({"op": "c", "ts_ms": 1234, "before": None, "after": {"id": 1, "name": "Alice"}})
    assert changelog == [("+I", {"id": 1, "name": "Alice", "ts_ms": 1234})]
    assert list(changelog[0][1]) == ["id", "name", "ts_ms"]  # payload fields, then passthrough fields


# --- 4.1.3 use cases ------------------------------------------------------------------------------

C1, U1, D1 = ({"__op": "c", "id": 1, "v": "a"}, {"__op": "u", "id": 1, "v": "b"}, {"__op": "d", "id": 1, "v": "b"})


def envelope(op: str, before: dict | None, after: dict | None) -> dict:
    return {"op": op, "before": before, "after": after}


A, B = {"id": 1, "v": "a"}, {"id": 1, "v": "b"}
NESTED = dict(before="before", after="after")


def test_4_1_3_1_upsert_stream_to_upsert_stream():
    changelog = Stream(op="__op", op_mapping=DEBEZIUM_UPSERT).feed(C1, U1, D1)
    assert changelog == [("+I", A), ("+U", B), ("-D", B)]


def test_4_1_3_2_retract_stream_to_retract_stream():
    stream = Stream(**NESTED, op_mapping=DEBEZIUM_RETRACT)
    changelog = stream.feed(envelope("c", None, A), envelope("u", A, B), envelope("d", B, None))
    assert changelog == [("+I", A), ("-U", A), ("+U", B), ("-D", B)]


def test_4_1_3_3_retract_stream_to_upsert_stream():
    stream = Stream(**NESTED, op_mapping=DEBEZIUM_UPSERT)
    changelog = stream.feed(envelope("r", None, A), envelope("u", A, B), envelope("d", B, None))
    assert changelog == [("+I", A), ("+U", B), ("-D", B)]  # the before image is ignored


def test_4_1_3_4_upsert_stream_to_upsert_stream_with_before_after():
    stream = Stream(**NESTED, op_mapping=DEBEZIUM_UPSERT)
    changelog = stream.feed(envelope("c", None, A), envelope("u", None, B), envelope("d", {"id": 1}, None))
    assert changelog == [("+I", A), ("+U", B), ("-D", {"id": 1})]


def test_4_1_3_5_consuming_partial_deletes_from_an_upsert_source():
    assert Stream(op_mapping={"c": "INSERT", "d": "DELETE", "u": "UPDATE_AFTER"}).feed({"op": "d", "id": 5}) == [
        ("-D", {"id": 5})
    ]


def test_4_1_3_6_consuming_full_deletes_from_a_cdc_source():
    stream = Stream(consume_full_deletes=True, op_mapping={"c": "INSERT", "d": "DELETE", "u": "UPDATE_AFTER"})
    assert stream.feed({"op": "d", "id": 5, "name": "Alice", "age": 30}) == [
        ("-D", {"id": 5, "name": "Alice", "age": 30})
    ]


def flagged(deleted, v: str) -> dict:
    return {"deleted": deleted, "id": 1, "v": v}


def test_4_1_3_7_upsert_stream_to_retract_stream_with_deletion_flag():
    stream = Stream(op="deleted", state_ttl_seconds=600,
                    op_mapping={"false": "INSERT, UPDATE_BEFORE, UPDATE_AFTER", "true": "DELETE"})
    changelog = stream.feed(flagged("false", "a"), flagged(False, "b"), flagged("true", "b"))
    assert changelog == [("+I", A), ("-U", A), ("+U", B), ("-D", B)]  # a boolean flag maps through 'false'


@pytest.mark.parametrize("params", [
    {"op": "deleted", "op_mapping": {"false": "INSERT, UPDATE_AFTER", "true": "DELETE"}},
    {"preset": "deletion-flag", "op": "deleted"},
])
def test_4_1_3_8_upsert_stream_to_upsert_stream_with_deletion_flag(params):
    stream = Stream(state_ttl_seconds=600, **params)
    changelog = stream.feed(flagged("false", "a"), flagged("false", "b"), flagged(True, "b"), flagged("false", "a"))
    assert changelog == [("+I", A), ("+U", B), ("-D", B), ("+I", A)]
    stateless = Stream(**params).feed(flagged("false", "a"), flagged("false", "b"))
    assert stateless == [("+U", A), ("+U", B)]  # without state an upsert cannot tell +I from +U


def test_4_1_3_9_upsert_stream_to_retract_stream():
    stream = Stream(op="__op", state_ttl_seconds=600, op_mapping=DEBEZIUM_RETRACT)
    assert stream.feed(C1, U1, D1) == [("+I", A), ("-U", A), ("+U", B), ("-D", B)]


def test_4_1_3_10_upsert_stream_to_retract_stream_with_before_after():
    clock = FakeClock("12:00")
    stream = Stream(**NESTED, state_ttl_seconds=600, op_mapping=DEBEZIUM_RETRACT, clock=clock)
    changelog = stream.feed(envelope("c", None, A), envelope("u", None, B))
    assert changelog == [("+I", A), ("-U", A), ("+U", B)]  # -U from state: the input has no before image
    clock.set("12:30")  # spec 4.3.3: the image expired, the update becomes an insert
    assert stream.feed(envelope("u", None, A)) == [("+I", A)]


def test_4_1_3_11_cdc_stream_with_envelope_metadata():
    stream = Stream(primary_key=("user_id",), **NESTED, passthrough=["ts_ms"], partition_by=["user_id", "tenant_id"],
                    op_mapping=DEBEZIUM_UPSERT)
    after = {"user_id": 1, "tenant_id": 3, "name": "Alice"}  # tenant_id added: 4.3.5 needs the partition columns
    rows = stream.rows({"op": "c", "ts_ms": 1234, "before": None, "after": after})
    assert changes(rows) == [("+I", {"user_id": 1, "tenant_id": 3, "name": "Alice", "ts_ms": 1234})]
    assert (rows[0]["key"], rows[0]["partition_key"]) == ("[1]", "[1,3]")


# --- 4.3.5 NULL op / key, record-level policies ---------------------------------------------------


def rejected(params: dict, value, key=None) -> dict:
    (row,) = ChangelogBatchDecoder(FromChangelogSettings(**params), ("id",))(kafka_batch([value], [key])).to_pylist()
    assert row["kind"] is None and row["row"] is None
    return {name: row[name] for name in ("error", "handling", "stage")}


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({"op": None, "id": 1}, "record has a null 'op' field"),
        ({"id": 1}, "record has no 'op' field"),
        ({"op": "INSERT", "id": None}, "primary key column 'id' is missing or null in the record"),
        ({"op": "DELETE", "name": "x"}, "primary key column 'id' is missing or null in the record"),
    ],
)
def test_4_3_5_null_op_or_key_fails(value, error):
    assert rejected({}, value) == {"error": error, "handling": "FAIL", "stage": "from_changelog"}


def test_null_upsert_and_partition_columns_fail_too():
    decoder = ChangelogBatchDecoder(FromChangelogSettings(partition_by=["tenant"]), ("id",), upsert_key=("id", "v"))
    (row,) = decoder(kafka_batch([{"op": "INSERT", "id": 1, "v": None, "tenant": 2}])).to_pylist()
    assert row["error"] == "upsert key column 'v' is missing or null in the record"
    (row,) = decoder(kafka_batch([{"op": "INSERT", "id": 1, "v": 3}])).to_pylist()
    assert row["error"] == "partition_by column 'tenant' is missing or null in the record"


@pytest.mark.parametrize("policy", ["FAIL", "LOG", "SKIP", "DEAD_LETTER"])
def test_4_3_1_invalid_op_codes_carry_their_policy(policy):
    assert rejected({"invalid_op_handling": policy}, {"op": "UPSERT", "id": 1}) == {
        "error": "unknown op code 'UPSERT'", "handling": policy, "stage": "from_changelog"
    }


def test_decode_errors_carry_the_decode_policy():
    batch = kafka_batch([1])
    batch = batch.set_column(1, "value", pa.array([b"{not json"], pa.binary()))
    (row,) = ChangelogBatchDecoder(FromChangelogSettings(decode_error_handling="DEAD_LETTER"), ("id",))(
        batch).to_pylist()
    assert (row["handling"], row["stage"], row["raw_value"]) == ("DEAD_LETTER", "decode", b"{not json")


def test_a_passthrough_clash_fails_naming_the_column():
    params = {"preset": "debezium", "passthrough": ["ts_ms"]}
    assert rejected(params, {"op": "c", "ts_ms": 1, "after": {"id": 1, "ts_ms": 2}}) == {
        "error": "passthrough column 'ts_ms' clashes with a row column of the same name",
        "handling": "FAIL", "stage": "from_changelog",
    }


def test_passthrough_in_flat_mode_only_adds_nested_paths():
    stream = Stream(passthrough=["ts_ms", "source.lsn"])  # 4.3.7: top-level fields are columns already
    assert stream.feed({"op": "INSERT", "id": 1, "ts_ms": 5, "source": {"lsn": 9}}) == [
        ("+I", {"id": 1, "ts_ms": 5, "source": {"lsn": 9}, "source_lsn": 9})
    ]


def test_upsert_kafka_takes_the_key_columns_and_deletes_on_tombstones():
    keys = [b'{"id": 1}', b'{"id": 1}', b'{"id": 1}', b'{"id": 1}']
    stateless = Stream(preset="upsert-kafka").feed({"v": "a"}, {"v": "b"}, None, keys=keys[:3])
    assert stateless == [("+U", A), ("+U", B), ("-D", {"id": 1})]
    stateful = Stream(preset="upsert-kafka", state_ttl_seconds=0).feed({"v": "a"}, {"v": "b"}, None, {"v": "a"},
                                                                        keys=keys)
    assert stateful == [("+I", A), ("+U", B), ("-D", {"id": 1}), ("+I", A)]


def test_stateful_settings_need_an_upsert_key_inside_partition_by():
    stateful = FromChangelogSettings(state_ttl_seconds=0, partition_by=["tenant"])
    with pytest.raises(ConfigError, match="partition_by must hold every upsert key column"):
        FromChangelog(stateful, ("id",))
    with pytest.raises(ConfigError, match="needs an upsert key"):
        FromChangelog(FromChangelogSettings(state_ttl_seconds=0), ("id",), upsert_key=())
    assert FromChangelog(FromChangelogSettings(state_ttl_seconds=0, partition_by=["id", "t"]), ("id",))


def test_whole_row_upsert_key():
    rows = ChangelogBatchDecoder(FromChangelogSettings(), ("id",), upsert_key=())(
        kafka_batch([{"op": "INSERT", "v": "x", "id": 1}])).to_pylist()
    assert rows[0]["upsert_key"] == '{"id":1,"v":"x"}' and rows[0]["partition_key"] == "[1]"  # by the primary key


@pytest.mark.parametrize(
    ("value", "type_name", "expected"),
    [
        (1_700_000_000_123, None, 1_700_000_000_123),
        (1_700_000_000_123_456, "timestamp_us", 1_700_000_000_123),
        (1_700_000_000_123_456_789, "timestamp_ns", 1_700_000_000_123),
        (2, "date32", 172_800_000),
        ("2024-01-01T10:05:00.000001Z", None, ms("10:05")),
        ("2024-01-01T11:05:00+01:00", None, ms("10:05")),
        ("2024-01-01T10:05:00", None, ms("10:05")),
    ],
)
def test_event_time_values(value, type_name, expected):
    assert event_time_ms(value, type_name) == expected


def test_event_time_errors_do_not_quote_the_value():
    error = rejected({"order_by": "at"}, {"op": "INSERT", "id": 1, "at": "yesterday-ish"})["error"]
    assert error == "order_by 'at' is not ISO-8601 text"
    error = rejected({"order_by": "at"}, {"op": "INSERT", "id": 1, "at": True})["error"]
    assert error == "order_by 'at' is not a timestamp (got bool)"
    assert rejected({"order_by": "at"}, {"op": "INSERT", "id": 1})["error"] == "order_by 'at' is missing or null"
