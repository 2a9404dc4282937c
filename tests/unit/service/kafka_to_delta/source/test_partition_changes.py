"""The plain path's reduction where records are read (`partition_changes`) and its merge on the
driver (`batch_changes`), on real Debezium envelopes through the real decoder (no Spark).

Seeds: `FIXED_SEEDS` plus one random seed, printed in the failure message.
"""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from connectors.kafka.range_reader import SOURCE_SCHEMA
from service.config.settings import PipelineSettings
from service.kafka_to_delta.materialize.net_changes import pack_net, unpack_net
from service.kafka_to_delta.materialize.payload import NetPayload
from service.kafka_to_delta.rows.arrow import PAYLOAD_SCHEMA
from service.kafka_to_delta.rows.names import PACKED_COLUMN, Meta
from service.kafka_to_delta.rows.spark import NET_SCHEMA
from service.kafka_to_delta.source.batch_changes import batch_changes
from service.kafka_to_delta.source.decode_stage import batch_decoder
from service.kafka_to_delta.source.partition_changes import PartitionReducer
from service.operations.workload import DebeziumWorkload
from tests.support.run_seed import run_seed
from vocabulary.errors import DecodeError

FIXED_SEEDS = (0, 7, 994)
RANDOM_SEED = run_seed(1_000_000)
_HEADERS = SOURCE_SCHEMA.field("headers").type


def _pipeline(**from_changelog) -> PipelineSettings:
    return PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"],
                            from_changelog={"preset": "debezium", **from_changelog})


def _records(pairs: list[tuple[bytes | None, bytes | None]], partition: int = 0, first: int = 0) -> pa.RecordBatch:
    n = len(pairs)
    return pa.RecordBatch.from_pydict({
        "key": [k for k, _ in pairs], "value": [v for _, v in pairs], "topic": ["t"] * n,
        "partition": pa.array([partition] * n, pa.int32()), "offset": pa.array(range(first, first + n), pa.int64()),
        "timestamp": pa.array([1_700_000_000_000_000 + i for i in range(n)], pa.timestamp("us", tz="UTC")),
        "headers": pa.nulls(n, _HEADERS), "watermark_floor": pa.nulls(n, pa.int64()),
    }, schema=SOURCE_SCHEMA)


def _split(batch: pa.RecordBatch, rng: random.Random) -> list[pa.RecordBatch]:
    cuts = sorted(rng.sample(range(1, batch.num_rows), 3)) if batch.num_rows > 4 else []
    bounds = [0, *cuts, batch.num_rows]
    return [batch.slice(a, b - a) for a, b in zip(bounds, bounds[1:])]


def _reduce(pipeline: PipelineSettings, batches: list[pa.RecordBatch]) -> pa.Table:
    reducer = PartitionReducer(batch_decoder(pipeline), pipeline.primary_key)
    return pa.Table.from_batches(list(reducer(lambda: iter(batches))), schema=PAYLOAD_SCHEMA)


def _envelope(op: str, before: dict | None, after: dict | None) -> bytes:
    return json.dumps({"before": before, "after": after, "op": op}).encode()


def _key(key: int) -> bytes:
    return json.dumps({"id": key}).encode()


def _net(changes: pa.Table) -> tuple[dict[int, dict], set[int]]:
    """(upserted rows by id, deleted ids) of a batch's typed changes."""
    rows = changes.to_pylist()
    upserts = {r["id"]: {k: v for k, v in r.items() if not k.startswith("__cdc_")}
               for r in rows if r[Meta.KIND] == "+U"}
    return upserts, {r["id"] for r in rows if r[Meta.KIND] == "-D"}


@pytest.mark.parametrize("seed", [*FIXED_SEEDS, RANDOM_SEED])
def test_any_batch_split_and_partitioning_gives_the_replayed_table(seed):
    rng = random.Random(seed)
    workload = DebeziumWorkload("t", 3, "mixed", seed=seed)
    events = workload.generate(3_000, 400)
    payloads = []
    for partition in range(3):
        pairs = [(e.key, e.value) for e in events if e.partition == partition]
        payloads.append(_reduce(_pipeline(), _split(_records(pairs, partition), rng)))
    found = batch_changes(pa.concat_tables(payloads))
    upserts, deletes = _net(found.changes)
    where = f"seed {seed}"
    assert upserts == workload.table, where
    assert not deletes & set(workload.table), where
    ops = [json.loads(e.value) for e in events if e.value is not None]
    assert found.count == sum(2 if doc.get("payload", doc)["op"] == "u" else 1 for doc in ops), where
    assert found.failed.num_rows == 0 and not found.truncated, where
    assert found.changes.schema.field("balance").type == pa.float64(), where
    assert found.changes.schema.field("id").type == pa.int64(), where


def test_a_key_in_two_partitions_keeps_its_last_change_in_source_order():
    first = _reduce(_pipeline(), [_records([(_key(1), _envelope("c", None, {"id": 1, "v": 1}))], partition=0)])
    second = _reduce(_pipeline(), [_records([(_key(1), _envelope("u", None, {"id": 1, "v": 2}))], partition=1)])
    upserts, _ = _net(batch_changes(pa.concat_tables([second, first])).changes)
    assert upserts == {1: {"id": 1, "v": 2}}


def test_column_types_are_decided_over_all_ranges():
    # An int in one range and a float in another make float64; an all-null column types from the other range.
    ints = _reduce(_pipeline(), [_records([(_key(1), _envelope("c", None, {"id": 1, "x": 3, "y": None}))])])
    floats = _reduce(_pipeline(), [_records([(_key(2), _envelope("c", None, {"id": 2, "x": 2.5, "y": True}))],
                                            partition=1)])
    changes = batch_changes(pa.concat_tables([ints, floats])).changes
    assert changes.schema.field("x").type == pa.float64()
    assert changes.schema.field("y").type == pa.bool_()
    assert _net(changes)[0] == {1: {"id": 1, "x": 3.0, "y": None}, 2: {"id": 2, "x": 2.5, "y": True}}


def test_truncate_wipes_the_earlier_changes_of_its_range_only():
    pairs = [(_key(1), _envelope("c", None, {"id": 1})), (None, _envelope("t", None, None)),
             (_key(2), _envelope("c", None, {"id": 2}))]
    truncating = _reduce(_pipeline(truncate_handling="truncate"), [_records(pairs)])
    other = _reduce(_pipeline(truncate_handling="truncate"),
                    [_records([(_key(3), _envelope("c", None, {"id": 3}))], partition=1)])
    found = batch_changes(pa.concat_tables([truncating, other]))
    assert found.truncated
    assert set(_net(found.changes)[0]) == {2, 3}


def test_unchanged_columns_are_filled_from_an_earlier_image_in_another_micro_batch_of_the_range():
    toast = "__debezium_unavailable_value"
    first = _records([(_key(1), _envelope("c", None, {"id": 1, "body": "long", "rev": 1}))])
    second = _records([(_key(1), _envelope("u", None, {"id": 1, "body": toast, "rev": 2}))], first=1)
    changes = batch_changes(_reduce(_pipeline(), [first, second])).changes
    assert _net(changes)[0] == {1: {"id": 1, "body": "long", "rev": 2}}
    assert changes.column(Meta.UNCHANGED).to_pylist() == [None]


def test_unchanged_columns_without_an_earlier_image_stay_marked_for_the_sink():
    toast = "__debezium_unavailable_value"
    changes = batch_changes(_reduce(_pipeline(), [_records([(_key(1), _envelope("u", None, {
        "id": 1, "body": toast, "rev": 2}))])])).changes
    assert json.loads(changes.column(Meta.UNCHANGED)[0].as_py()) == ["body"]


def test_bad_records_travel_with_their_policy_and_bytes_and_good_ones_still_apply():
    pairs = [(_key(1), b"{not json"), (_key(2), _envelope("c", None, {"id": 2}))]
    found = batch_changes(_reduce(_pipeline(decode_error_handling="LOG"), [_records(pairs, first=40)]))
    failed = found.failed.to_pylist()
    assert [(f["offset"], f["handling"], f["stage"], f["raw_value"]) for f in failed] == [
        (40, "LOG", "decode", b"{not json")]
    assert set(_net(found.changes)[0]) == {2}


def _declaring(op: str, before: dict | None, after: dict | None) -> bytes:
    """An envelope with its Connect schema block: `id` int32, `v` int32."""
    image = {"type": "struct", "optional": True,
             "fields": [{"field": "id", "type": "int32"}, {"field": "v", "type": "int32", "optional": True}]}
    schema = {"type": "struct", "fields": [{**image, "field": "before"}, {**image, "field": "after"},
                                           {"field": "op", "type": "string"}]}
    return json.dumps({"schema": schema, "payload": {"before": before, "after": after, "op": op}}).encode()


@pytest.mark.parametrize("split", [False, True], ids=["one_batch", "split"])
def test_a_record_without_types_that_misfits_what_its_range_declares_is_rejected_alone(split):
    big = 2**40  # beyond the int32 that another record of the range declares for `v`
    pairs = [(_key(2), _envelope("c", None, {"id": 2, "v": 3})),  # valid: kept when its successor is rejected
             (_key(2), _envelope("u", {"id": 2, "v": 3}, {"id": 2, "v": big})),
             (_key(4), _envelope("c", None, {"id": 4, "v": "text"})),
             (_key(1), _declaring("c", None, {"id": 1, "v": 5})),
             (_key(3), _envelope("c", None, {"id": 3, "v": 7}))]
    records = _records(pairs, first=10)
    batches = [records.slice(0, 2), records.slice(2)] if split else [records]
    found = batch_changes(_reduce(_pipeline(decode_error_handling="LOG"), batches))
    assert _net(found.changes)[0] == {1: {"id": 1, "v": 5}, 2: {"id": 2, "v": 3}, 3: {"id": 3, "v": 7}}
    assert found.changes.schema.field("v").type == pa.int32()
    failed = found.failed.to_pylist()
    assert [(f["offset"], f["handling"], f["stage"], f["raw_value"]) for f in failed] == [
        (11, "LOG", "decode", pairs[1][1]), (12, "LOG", "decode", pairs[2][1])]
    assert all(f["error"].startswith("row does not fit the column types other records of its Kafka range declare")
               and "column 'v'" in f["error"] and str(big) not in f["error"] for f in failed)


def test_a_record_without_types_that_misfits_what_another_range_declares_stops_the_batch_naming_it():
    big = 2**40
    declaring = _reduce(_pipeline(), [_records([(_key(1), _declaring("c", None, {"id": 1, "v": 5}))], partition=0)])
    fitting = _reduce(_pipeline(), [_records([(_key(3), _envelope("c", None, {"id": 3, "v": 7}))], partition=2)])
    assert _net(batch_changes(pa.concat_tables([declaring, fitting])).changes)[0] == {
        1: {"id": 1, "v": 5}, 3: {"id": 3, "v": 7}}
    bare = _reduce(_pipeline(), [_records([(_key(2), _envelope("c", None, {"id": 2, "v": big}))], partition=1, first=8)])
    with pytest.raises(DecodeError, match=r"column 'v' as int32.*\(topic=t partition=1 offset=8 key=") as caught:
        batch_changes(pa.concat_tables([declaring, fitting, bare]))
    assert str(big) not in str(caught.value)


def test_net_rows_of_a_stateful_stage_that_misfit_declared_types_stop_the_batch_naming_the_record():
    where = {"topic": "t", "partition": 0}
    rows = [_net_rows([
        {**where, "offset": 3, "key": "[1]", "kind": "+U", "row": '{"id":1,"v":5}', "types": '{"id":"int32","v":"int32"}'},
        {**where, "offset": 9, "key": "[2]", "kind": "+U", "row": '{"id":2,"v":1099511627776}'},
    ])]
    with pytest.raises(DecodeError, match=r"column 'v'.*\(topic=t partition=0 offset=9 key=") as caught:
        list(NetPayload(("id",))(iter(rows)))
    assert "1099511627776" not in str(caught.value)


def test_a_batch_of_nothing_but_tombstones_and_deletes_deletes_by_primary_key():
    pairs = [(_key(5), _envelope("d", {"id": 5, "v": 1}, None)), (_key(5), None)]
    upserts, deletes = _net(batch_changes(_reduce(_pipeline(), [_records(pairs)])).changes)
    assert upserts == {} and deletes == {5}


def _net_rows(rows: list[dict]) -> pa.RecordBatch:
    schema = to_arrow_schema(NET_SCHEMA)
    base = {name: None for name in schema.names}
    base.update(changes=1, conflicts=0, rollbacks=0, stale_dropped=0, cleared_state_warnings=0, state_bytes=0)
    return pa.RecordBatch.from_pylist([{**base, **row} for row in rows], schema=schema)


def _packed(batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """The bucket materializer's form of the same rows: one Arrow IPC value per call."""
    return [pa.RecordBatch.from_pydict({PACKED_COLUMN: [pack_net(b.to_pylist())]}) for b in batches]


def test_packed_net_rows_come_back_unchanged():
    rows = [{"key": "[1]", "kind": "+U", "row": '{"id":1}', "topic": "t", "partition": 2, "offset": 7,
             "headers": [{"key": "h", "value": b"\x00\xff"}], "raw_value": b"\x01",
             "earlier_images": [{"row": '{"id":1,"v":"a"}', "unchanged": None}], "conflicts": 3},
            {"key": None, "error": "bad", "handling": "SKIP", "stage": "decode", "offset": 8}]
    unpacked = list(unpack_net(_packed([_net_rows(rows)])))
    assert pa.Table.from_batches(unpacked).to_pylist() == _net_rows(rows).to_pylist()


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
def test_net_rows_of_a_stateful_stage_become_typed_payloads_and_truncates_apply_across_spark_partitions(packed):
    where = {"topic": "t", "partition": 0}
    first = [_net_rows([
        {**where, "offset": 3, "key": "[1]", "kind": "+U", "row": '{"id":1,"v":"old"}', "conflicts": 2},
        {**where, "offset": 9, "key": "[2]", "kind": "+U", "row": '{"id":2,"v":"new"}', "types": '{"id":"int32"}'},
        {**where, "offset": 4, "error": "bad", "handling": "SKIP", "stage": "decode", "raw_value": b"x"},
    ])]
    second = [_net_rows([{**where, "offset": 5, "key": None, "kind": "TRUNCATE", "rollbacks": 1}])]
    if packed:
        first, second = _packed(first), _packed(second)
    payloads = [pa.Table.from_batches(list(NetPayload(("id",))(iter(part)))) for part in (first, second)]
    found = batch_changes(pa.concat_tables(payloads))
    assert _net(found.changes)[0] == {2: {"id": 2, "v": "new"}}
    assert found.changes.schema.field("id").type == pa.int32()
    assert found.truncated
    assert found.counters["conflicts"] == 2 and found.counters["rollbacks"] == 1
    assert found.failed.column("error").to_pylist() == ["bad"]
    assert found.count == 4


def test_a_spark_partition_without_net_rows_sends_nothing():
    assert list(NetPayload(("id",))(iter([]))) == []
