"""The materializer with state per key bucket: its processor under pyspark's TwsTester (no Spark).

Inside Spark the same processor runs through `materialize` (tests/integration/service/kafka_to_delta/materialize/test_key_stage.py,
the e2e materializer tests); here each call is one bucket's input of one micro-batch."""

from __future__ import annotations

import json

import orjson
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql.streaming.tws_tester import TwsTester

from service.kafka_to_delta.materialize import bucket_stage
from service.kafka_to_delta.materialize.bucket_document import decode_bucket
from service.kafka_to_delta.materialize.bucket_stage import GROUP_COLUMN, BucketProcessor
from service.kafka_to_delta.materialize.bulk import StageConfig
from service.kafka_to_delta.materialize.key_stage import time_mode
from service.kafka_to_delta.materialize.net_changes import unpack_net
from service.kafka_to_delta.materialize.payload import NetPayload
from service.kafka_to_delta.materialize.rules import MaterializerConfig
from service.kafka_to_delta.materialize.rules_columns import compact_columns
from service.kafka_to_delta.rows.arrow import CHANGELOG_SCHEMA
from service.kafka_to_delta.rows.ipc import ipc_bytes
from service.kafka_to_delta.rows.names import GROUP, PACKED_CHANGES, error_group_key
from service.kafka_to_delta.rows.spark import NET_ARROW_SCHEMA, NET_SCHEMA
from service.kafka_to_delta.source.batch_changes import batch_changes
from tests.unit.service.kafka_to_delta.materialize.test_rules_columns import STAGE_SCHEMA

BUCKET = 7
NEVER_LATE = 2**62  # the stage does not drop late rows; TwsTester would, unless told they are never late


def _text(value) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def change(kind: str, row: dict, offset: int, event_time: int = 5_000, **extra) -> dict:
    """One input row of the bucket stage (CHANGELOG_SCHEMA names, the group key under GROUP_COLUMN)."""
    key = _text([row["id"]])
    values = dict.fromkeys(CHANGELOG_SCHEMA.names)
    values.update(topic="t", partition=0, offset=offset, change_index=0, timestamp=1_000 + offset, kind=kind,
                  key=key, upsert_key=key, row=_text(row), event_time=event_time)
    values.update(extra)
    values[GROUP_COLUMN] = values["key"] if values["error"] is None else error_group_key(f"t:0:{offset}")
    return values


def _tester(strategy: str = "error", compaction: str = "batch", ttl_ms: int = 0,
            payload_key: tuple[str, ...] | None = None) -> TwsTester:
    rules = MaterializerConfig(table="t1", primary_key=("id",), on_conflict=strategy)
    config = StageConfig(rules=rules, compaction=compaction, state_ttl_ms=ttl_ms, key_buckets=64)
    mode = time_mode(config)
    extractor = (lambda _row: NEVER_LATE) if mode == "EventTime" else None
    processor = BucketProcessor(config, payload_key)
    return TwsTester(processor, timeMode=mode, outputMode="Update", eventTimeExtractor=extractor)


def _call(tester: TwsTester, changes: list[dict]) -> dict[str, dict]:
    return {row["key"]: row for row in _unpacked(tester.testInPandas(BUCKET, pd.DataFrame(changes)))}


def _unpacked(out: pd.DataFrame) -> list[dict]:
    """The net rows of the processor's output (packed: one Arrow IPC value per call)."""
    packed = [pa.RecordBatch.from_pandas(out, preserve_index=False)] if len(out) else []
    return pa.Table.from_batches(list(unpack_net(packed)), schema=NET_ARROW_SCHEMA).to_pylist()


def _keys(tester: TwsTester) -> dict:
    stored = tester.peekValueState("keys", BUCKET)
    return decode_bucket(None if stored is None else stored[0])


def test_one_call_compacts_every_key_of_the_bucket_and_keeps_one_state_document():
    tester = _tester()
    a, b = {"id": 1, "v": "a"}, {"id": 2, "v": "b"}
    out = _call(tester, [change("+I", a, 0), change("+I", b, 1), change("-U", a, 2),
                         change("+U", {**a, "v": "a2"}, 3)])
    assert {k: (r["kind"], json.loads(r["row"]), r["changes"]) for k, r in out.items()} == {
        "[1]": ("+U", {"id": 1, "v": "a2"}, 3), "[2]": ("+U", b, 1)}
    assert set(out["[1]"]) == set(NET_SCHEMA.names)
    assert set(_keys(tester)) == {"[1]", "[2]"}
    # The next micro-batch deletes one key: its state leaves the document, the other key stays.
    out = _call(tester, [change("-D", b, 4)])
    assert (out["[2]"]["kind"], set(_keys(tester))) == ("-D", {"[1]"})


def test_a_conflict_of_one_key_is_decided_with_the_state_of_earlier_micro_batches():
    tester = _tester("nothing")
    _call(tester, [change("+I", {"id": 1, "v": "first"}, 0, upsert_key='["x"]')])
    out = _call(tester, [change("+I", {"id": 1, "v": "second"}, 1, upsert_key='["y"]')])
    assert (out["[1]"]["kind"], out["[1]"]["conflicts"]) == (None, 1)


def test_failed_rows_pass_through_untouched():
    tester = _tester()
    bad = change("+I", {"id": 1}, 7, error="bad record", handling="FAIL", stage="decode", raw_value=b"\x00")
    bad.update(kind=None, row=None)
    [out] = _call(tester, [bad]).values()
    assert (out["error"], out["offset"], out["raw_value"], out["kind"]) == ("bad record", 7, b"\x00", None)
    assert _keys(tester) == {}


def test_with_the_primary_key_a_call_emits_what_the_payload_stage_makes_of_its_net_rows():
    """The payload rows of a call (typed in the call) and those `NetPayload` makes of the same call's
    packed net rows give the driver the same batch: changes, failed records, counts and counters."""
    batches = [
        [change("+I", {"id": 1, "v": "a"}, 0), change("+I", {"id": 2, "v": 2.5}, 1), change("+I", {"id": 3}, 2)],
        [change("-U", {"id": 1, "v": "a"}, 3), change("+U", {"id": 1, "v": "b"}, 4), change("-D", {"id": 2, "v": 2.5}, 5),
         change("-U", {"id": 9, "v": "never held"}, 6), change("+I", {"id": 3, "v": "x"}, 7, upsert_key='["other"]')],
    ]
    bad = change("+I", {"id": 5}, 8, error="bad record", handling="DEAD_LETTER", stage="decode", raw_value=b"\x00")
    bad.update(kind=None, row=None)
    batches[1].append(bad)
    direct, staged = _tester("nothing", payload_key=("id",)), _tester("nothing")
    for changes in batches:
        emitted = direct.testInPandas(BUCKET, pd.DataFrame(changes))
        packed = staged.testInPandas(BUCKET, pd.DataFrame(changes))
        through = list(NetPayload(("id",))(iter([pa.RecordBatch.from_pandas(packed, preserve_index=False)])))
        mine = batch_changes(pa.Table.from_pandas(emitted, preserve_index=False))
        theirs = batch_changes(pa.Table.from_batches(through))
        assert mine.changes.equals(theirs.changes) and mine.failed.equals(theirs.failed)
        assert (mine.count, mine.counters, mine.truncated) == (theirs.count, theirs.counters, theirs.truncated)
    assert (mine.changes.num_rows, mine.failed.num_rows) == (2, 1)
    assert (mine.counters["cleared_state_warnings"], mine.counters["conflicts"]) == (1, 1)


def test_watermark_compaction_waits_in_the_bucket_until_the_watermark_reaches_each_change():
    tester = _tester(compaction="watermark")
    tester.setWatermark(1_000)
    assert _call(tester, [change("+I", {"id": 1, "v": 1}, 0, event_time=5_000),
                          change("+I", {"id": 2, "v": 2}, 1, event_time=9_000)]) == {}
    assert len(tester.peekListState("waiting", BUCKET)) == 2
    out = tester.setWatermark(5_000)
    assert [(r["key"], r["kind"]) for r in _unpacked(out)] == [("[1]", "+U")]
    assert len(tester.peekListState("waiting", BUCKET)) == 1
    out = tester.setWatermark(9_000)
    assert [(r["key"], r["kind"]) for r in _unpacked(out)] == [("[2]", "+U")]
    assert tester.peekListState("waiting", BUCKET) == []


def test_state_ttl_drops_the_keys_the_watermark_left_behind_and_keeps_the_others():
    tester = _tester(ttl_ms=10_000)
    _call(tester, [change("+I", {"id": 1, "v": 1}, 0, event_time=5_000),
                   change("+I", {"id": 2, "v": 2}, 1, event_time=8_000)])
    assert {k: touched for k, (_, touched) in _keys(tester).items()} == {"[1]": 5_000, "[2]": 8_000}
    tester.setWatermark(15_000)
    assert set(_keys(tester)) == {"[2]"}
    tester.setWatermark(18_000)
    assert _keys(tester) == {}
    # After expiry a retraction finds nothing: counted, never fatal.
    out = _call(tester, [change("-D", {"id": 2, "v": 2}, 2, event_time=20_000)])
    assert (out["[2]"]["kind"], out["[2]"]["cleared_state_warnings"]) == (None, 1)


@pytest.mark.parametrize("layout", ["plain JSON", "zstd JSON"])
def test_a_document_of_an_earlier_layout_is_read_and_written_back_as_columns(layout):
    # Checkpoints written before hold one JSON document per bucket, plain or zstd-compressed.
    tester = _tester()
    a = {"id": 1, "v": "a"}
    _call(tester, [change("+I", a, 0)])
    plain = orjson.dumps(_keys(tester))
    earlier = plain if layout == "plain JSON" else (
        b"\x01" + len(plain).to_bytes(8, "little") + pa.Codec("zstd").compress(plain, asbytes=True))
    tester.updateValueState("keys", BUCKET, (earlier,))
    out = _call(tester, [change("-U", a, 1), change("+U", {**a, "v": "a2"}, 2)])
    assert (out["[1]"]["kind"], out["[1]"]["conflicts"], out["[1]"]["cleared_state_warnings"]) == ("+U", 0, 0)
    [stored] = tester.peekValueState("keys", BUCKET)
    assert stored[:1] == b"\x02"
    assert json.loads(_keys(tester)["[1]"][0])["l"][0]["r"] == _text({**a, "v": "a2"})


def test_a_column_left_unchanged_takes_the_value_an_earlier_change_of_its_source_gave_it():
    """A TOAST placeholder (`unchanged`) stands for the value the key's previous row in its source held:
    a change earlier in the same micro-batch fills it; a delete in between leaves it null; what no
    change of the batch holds stays unchanged (the table keeps its stored value)."""
    tester = _tester()
    unchanged = json.dumps(["body"])
    out = _call(tester, [
        change("+I", {"id": 1, "title": "a", "body": "first"}, 0),
        change("+U", {"id": 1, "title": "b", "body": "second"}, 1),
        change("+U", {"id": 1, "title": "c"}, 2, unchanged=unchanged),
        change("+U", {"id": 1, "title": "d"}, 3, unchanged=unchanged),
        change("+U", {"id": 2, "title": "x"}, 4, unchanged=unchanged),
        change("+I", {"id": 3, "title": "y", "body": "gone"}, 5), change("-D", {"id": 3}, 6),
        change("+I", {"id": 3, "title": "z"}, 7, unchanged=unchanged),
        change("+I", {"id": 4, "title": "t", "body": "other source"}, 8, topic="other"),
        change("+U", {"id": 4, "title": "u"}, 9, unchanged=unchanged),
    ])
    assert {k: (json.loads(r["row"]), r["unchanged"]) for k, r in out.items()} == {
        "[1]": ({"id": 1, "title": "d", "body": "second"}, None),
        "[2]": ({"id": 2, "title": "x"}, unchanged),
        "[3]": ({"id": 3, "title": "z", "body": None}, None),
        "[4]": ({"id": 4, "title": "u"}, unchanged),
    }
    # The next micro-batch's placeholder: no earlier change of it, so the table keeps what it stored.
    out = _call(tester, [change("+U", {"id": 1, "title": "e"}, 10, unchanged=unchanged)])
    assert (json.loads(out["[1]"]["row"]), out["[1]"]["unchanged"]) == ({"id": 1, "title": "e"}, unchanged)


@pytest.mark.parametrize("payload_key", [None, ("id",)])
def test_changes_packed_where_they_were_decoded_give_what_the_same_changes_as_rows_give(payload_key, monkeypatch):
    """Packed input takes the columns way (`rules_columns`) for the common keys: the same output and state
    as the rows (the rules for every key), micro-batch after micro-batch, a bad row and a conflict included."""
    unchanged = json.dumps(["v"])
    batches = [
        [change("+I", {"id": 1, "v": "a"}, 0), change("+I", {"id": 2, "v": 2}, 1), change("+I", {"id": 3}, 2),
         change("-D", {"id": 4}, 3)],
        [change("-U", {"id": 1, "v": "a"}, 4), change("+U", {"id": 1, "v": "b"}, 5), change("-D", {"id": 2, "v": 2}, 6),
         change("+I", {"id": 3, "v": "x"}, 7, upsert_key='["other"]'), change("+U", {"id": 5}, 8, unchanged=unchanged),
         change("+U", {"id": 1}, 9, unchanged=unchanged, types='{"id":"int64"}')],
        [change("+U", {"id": 1, "v": "b"}, 10), change("+I", {"id": 6, "v": "c"}, 11)],
    ]
    bad = change("+I", {"id": 7}, 12, error="bad record", handling="DEAD_LETTER", stage="decode", raw_value=b"\x00")
    bad.update(kind=None, row=None)
    batches[2].append(bad)
    as_rows, as_packed = _tester("nothing", payload_key=payload_key), _tester("nothing", payload_key=payload_key)
    decided = []

    def spied(*args):
        net, rest = compact_columns(*args)
        decided.append(0 if net is None else net.num_rows)
        return net, rest

    monkeypatch.setattr(bucket_stage, "compact_columns", spied)
    for changes in batches:
        from_rows = as_rows.testInPandas(BUCKET, pd.DataFrame(changes))
        records = [{**{k: v for k, v in c.items() if k != GROUP_COLUMN}, GROUP: c[GROUP_COLUMN]} for c in changes]
        packed = ipc_bytes(pa.Table.from_pylist(records, schema=STAGE_SCHEMA))
        from_packed = as_packed.testInPandas(BUCKET, pd.DataFrame({PACKED_CHANGES: [packed]}))
        if payload_key is None:
            assert sorted(_unpacked(from_packed), key=str) == sorted(_unpacked(from_rows), key=str)
        else:
            mine = batch_changes(pa.Table.from_pandas(from_packed, preserve_index=False))
            theirs = batch_changes(pa.Table.from_pandas(from_rows, preserve_index=False))
            assert mine.changes.sort_by("id").equals(theirs.changes.sort_by("id"))
            assert mine.failed.equals(theirs.failed)
            assert (mine.count, mine.counters) == (theirs.count, theirs.counters)
        assert _keys(as_packed) == _keys(as_rows)
    assert decided == [3, 2, 2]  # keys decided on the columns in each call (the rest by the rules)
