"""A bucket call's common case decided on columns (`rules_columns.compact_columns`, the keys it leaves then
through `compact_many`) against `compact_many` alone on the same call.

Random calls over a few keys, carried across micro-batches with the reference's states: adds and retractions
in any order (ties of timestamps broken by the other arrival columns, a record's -U and +U), two topics,
winners that leave columns unchanged, changes without types, and what the columns must leave to the rules
(a second upsert key, sequence values, failed rows, a retraction finding no live row, a stored state holding
a tombstone). The net rows, the states and the warnings must be the reference's. Fixed seeds, plus one random
seed (in the test id)."""

from __future__ import annotations

import copy
import logging
import random

import orjson
import pyarrow as pa
import pytest

from service.kafka_to_delta.materialize.bulk import arrival, compact_many
from service.kafka_to_delta.materialize.net_changes import net_table
from service.kafka_to_delta.materialize.rules import (
    Materializer,
    MaterializerConfig,
    MaterializerError,
)
from service.kafka_to_delta.materialize.rules_columns import compact_columns
from service.kafka_to_delta.rows.arrow import CHANGELOG_SCHEMA
from service.kafka_to_delta.rows.names import (
    EVENT_TIME,
    GROUP,
    STAGE_FIELDS,
    TYPED_IMAGE,
    TYPED_PREFIX,
    error_group_key,
)
from tests.support.run_seed import run_seed

SEEDS = [0, 1, 2, 5, 11, 99, 2024]
KEYS = [f'["k{i}"]' for i in range(6)]
_TYPES = {name: CHANGELOG_SCHEMA.field(name).type for name in CHANGELOG_SCHEMA.names}
STAGE_SCHEMA = pa.schema([(name, _TYPES.get(name, pa.int64() if name == EVENT_TIME else pa.string()))
                          for name in STAGE_FIELDS])


def _record(rnd: random.Random, key: str, offset: int, tombstones: bool) -> dict:
    kind = rnd.choice(["+I", "+U", "-U", "-D", "+U", "+I", "+U"])
    values = dict.fromkeys(STAGE_FIELDS)
    upsert_key = key if not tombstones or rnd.random() < 0.8 else '["other"]'
    values.update({
        GROUP: key, "kind": kind, "upsert_key": upsert_key, "key": key,
        "row": orjson.dumps({"id": key, "v": rnd.randint(0, 3), "body": rnd.choice(["x", "y"])}).decode(),
        "types": rnd.choice([None, '{"id":"string","v":"int64","body":"string"}']),
        "unchanged": '["body"]' if rnd.random() < 0.1 else None,
        "sequence": orjson.dumps([rnd.randint(0, 5)]).decode() if rnd.random() < 0.03 else None,
        EVENT_TIME: 1_000 + offset, "topic": rnd.choice(["a", "b"]) if rnd.random() < 0.3 else "a",
        "partition": rnd.randint(0, 1), "offset": offset, "change_index": 0,
        "timestamp": 1_000 + offset // 3,  # ties, broken by topic, partition, offset
    })
    if rnd.random() < 0.03:
        values.update(error="bad record", handling="LOG", stage="decode", kind=None, row=None,
                      **{GROUP: error_group_key(f"a:0:{offset}")})
    return values


def _call(rnd: random.Random, offset: int, tombstones: bool) -> list[dict]:
    records: list[dict] = []
    for _ in range(rnd.randint(1, 25)):
        key = rnd.choice(KEYS)
        record = _record(rnd, key, offset, tombstones)
        records.append(record)
        if record["kind"] == "-U" and rnd.random() < 0.5:  # an update's two halves: one record
            records.append({**_record(rnd, key, offset, tombstones), "kind": "+U", "change_index": 1,
                            "topic": record["topic"], "partition": record["partition"],
                            "timestamp": record["timestamp"], "upsert_key": record["upsert_key"]})
        offset += 1
    rnd.shuffle(records)
    return records


def _rows(table: pa.Table | None, records: list[dict]) -> list[dict]:
    rows = [] if table is None else table.to_pylist()
    rows += net_table(records).to_pylist() if records else []
    return sorted(rows, key=lambda row: (row["key"], row["offset"]))


def _run(seed: int, strategy: str, digests: bool, caplog: pytest.LogCaptureFixture) -> tuple[int, int]:
    rnd = random.Random(seed)
    tombstones = strategy == "deduplicate" and not digests  # a second upsert key needs the rows' texts
    rules = Materializer(MaterializerConfig("t", ("id",), strategy, tombstone_retention_ms=rnd.choice([0, 50])))
    states: dict = {}
    offset = decided = left = 0
    for _ in range(40):
        records = _call(rnd, offset, tombstones)
        offset += len(records)
        caplog.clear()
        expected_states = copy.deepcopy(states)
        table = pa.Table.from_pylist(records, schema=STAGE_SCHEMA)
        fast_states = copy.deepcopy(states)
        try:
            expected = compact_many(rules, sorted(records, key=arrival), expected_states, False, 0, digests)
        except MaterializerError:  # a conflict under `error`: the key is left to the rules, which raise
            columns, rest = compact_columns(table, fast_states, digests)
            with pytest.raises(MaterializerError):
                compact_many(rules, sorted(rest, key=arrival), fast_states, False, 0, digests)
            continue
        expected_logs = sorted(r.getMessage() for r in caplog.records)
        caplog.clear()
        columns, rest = compact_columns(table, fast_states, digests)
        ruled = compact_many(rules, sorted(rest, key=arrival), fast_states, False, 0, digests)
        assert sorted(r.getMessage() for r in caplog.records) == expected_logs
        assert _rows(columns, ruled) == _rows(None, expected), records
        assert fast_states == expected_states
        decided += 0 if columns is None else columns.num_rows
        left += len({r[GROUP] for r in rest})
        states = expected_states
    return decided, left


@pytest.mark.parametrize("digests", [False, True])
@pytest.mark.parametrize("strategy", ["error", "nothing", "deduplicate"])
@pytest.mark.parametrize("seed", [*SEEDS, run_seed(2**32)])
def test_the_columns_decide_a_call_as_the_rules_do(seed, strategy, digests, caplog):
    caplog.set_level(logging.WARNING)
    decided, left = _run(seed, strategy, digests, caplog)
    assert decided > 0 and left > 0  # both ways are taken in every run


def test_a_call_of_one_key_replacing_its_row_is_decided_on_the_columns():
    rules = Materializer(MaterializerConfig("t", ("id",), "error"))
    base = dict.fromkeys(STAGE_FIELDS)
    base.update({GROUP: '["k"]', "upsert_key": '["k"]', "key": '["k"]', "topic": "a", "partition": 0,
                 "change_index": 0, EVENT_TIME: 1})
    first = [{**base, "kind": "+I", "row": '{"id":"k","v":1}', "offset": 1, "timestamp": 1}]
    states: dict = {}
    compact_many(rules, first, states, False)
    later = [{**base, "kind": "+U", "row": '{"id":"k","v":2}', "offset": 3, "timestamp": 3, "types": '{"v":"int64"}'},
             {**base, "kind": "-U", "row": '{"id":"k","v":1}', "offset": 2, "timestamp": 2}]
    columns, rest = compact_columns(pa.Table.from_pylist(later, schema=STAGE_SCHEMA), states, False)
    assert rest == [] and columns is not None
    (net,) = columns.to_pylist()
    assert (net["kind"], net["row"], net["types"], net["offset"], net["changes"]) == (
        "+U", '{"id":"k","v":2}', '{"v":"int64"}', 3, 2)
    assert orjson.loads(states['["k"]'][0])["l"][0]["r"] == '{"id":"k","v":2}'


@pytest.mark.parametrize("seed", [*SEEDS, run_seed(2**32)])
def test_a_decided_net_row_carries_its_winners_typed_image(seed):
    rnd = random.Random(seed)
    for _ in range(20):  # a call whose every key is left to the rules (retractions first) is drawn again
        records = _call(rnd, 0, False) + _call(rnd, 100, False)
        table = pa.Table.from_pylist(records, schema=STAGE_SCHEMA)
        values = [None if r["row"] is None else orjson.loads(r["row"])["v"] for r in records]
        table = table.append_column(TYPED_PREFIX + "v", pa.array(values, pa.int32()))
        table = table.append_column(TYPED_IMAGE, pa.array([v is not None for v in values]))
        columns, rest = compact_columns(table, {}, False)
        if columns is not None:
            break
    assert columns is not None, f"seed {seed}"
    assert all(name in STAGE_FIELDS for record in rest for name in record)  # the rules get no typed images
    for net in columns.to_pylist():
        winner = next(r for r in records if (r["topic"], r["partition"], r["offset"]) == (
            net["topic"], net["partition"], net["offset"]) and r["row"] == net["row"]) if net["row"] else None
        if winner is not None:
            assert (net[TYPED_PREFIX + "v"], net[TYPED_IMAGE]) == (orjson.loads(winner["row"])["v"], True), seed
