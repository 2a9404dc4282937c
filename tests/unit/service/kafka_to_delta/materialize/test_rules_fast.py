"""The rules' common case decided without their objects (`materializer_fast.simple_outcome`) against the
rules themselves (`Materializer.apply`, through `materializer_bulk.change_of`).

Random runs of a key's micro-batches: mostly the common shape (one upsert key, no sequence_by), mixed
with what it must refuse (a second upsert key, sequence_by values, a state with a conflict or a
tombstone). Wherever the common case answers, its state text, net change, counters and warnings equal
the rules'; every key is carried on with the rules' state, so both see the same states. Fixed seeds,
plus one random seed (in the test id)."""

from __future__ import annotations

import logging
import random

import orjson
import pytest

from service.kafka_to_delta.materialize.bulk import change_of
from service.kafka_to_delta.materialize.rules import Materializer, MaterializerConfig
from service.kafka_to_delta.materialize.rules_fast import simple_outcome
from service.kafka_to_delta.rows.names import EVENT_TIME
from tests.support.run_seed import run_seed

SEEDS = [0, 1, 2, 5, 11, 99, 2024]
STRATEGIES = ["error", "nothing", "deduplicate"]


def _record(rnd: random.Random, offset: int, keys: list[str], sequenced: bool) -> dict:
    kind = rnd.choice(["+I", "+U", "-U", "-D", "+U", "+I"])
    return {
        "kind": kind, "upsert_key": rnd.choice(keys), "row": orjson.dumps({"id": 1, "v": rnd.randint(0, 3)}).decode(),
        "topic": rnd.choice(["a", "b"]), "partition": rnd.randint(0, 2), "offset": offset,
        "sequence": orjson.dumps([rnd.randint(0, 5)]).decode() if sequenced else None, EVENT_TIME: 1_000 + offset,
    }


def _run(seed: int, strategy: str, caplog: pytest.LogCaptureFixture) -> tuple[int, int]:
    rnd = random.Random(seed)
    rules = Materializer(MaterializerConfig("t", ("id",), strategy, tombstone_retention_ms=rnd.choice([0, 50])))
    state: str | None = None
    offset = answered = refused = 0
    for _ in range(60):
        keys = ['["k"]'] if rnd.random() < 0.8 else ['["k"]', '["other"]']
        sequenced = rnd.random() < 0.1
        records = [_record(rnd, offset + i, keys, sequenced) for i in range(rnd.randint(1, 4))]
        offset += len(records)
        caplog.clear()
        fast = simple_outcome(rules, '["pk"]', state, records)
        fast_logs = [r.getMessage() for r in caplog.records]
        caplog.clear()
        try:
            expected = rules.apply('["pk"]', state, [change_of(r, False) for r in records], 1_000 + offset)
        except Exception:  # noqa: BLE001 - a conflict under `error`: the common case must have refused
            assert fast is None
            continue
        logs = [r.getMessage() for r in caplog.records]
        if fast is None:
            refused += 1
        else:
            answered += 1
            assert (fast.new_state, fast.net, fast.counters, fast_logs) == (
                expected.new_state, expected.net, expected.counters, logs), records
        state = expected.new_state
    return answered, refused


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("seed", [*SEEDS, run_seed(2**32)])
def test_the_common_case_decides_as_the_rules_do(seed, strategy, caplog):
    caplog.set_level(logging.WARNING)
    answered, refused = _run(seed, strategy, caplog)
    assert answered > 0  # the runs reach the common case (and, over the seeds, its refusals)


def test_the_common_case_refuses_what_it_does_not_decide():
    rules = Materializer(MaterializerConfig("t", ("id",), "deduplicate"))
    add = {"kind": "+I", "upsert_key": '["a"]', "row": "{}", "topic": "t", "partition": 0, "offset": 1,
           "sequence": None, EVENT_TIME: 1}
    two_rows = rules.apply('["pk"]', None, [change_of(add, False), change_of({**add, "upsert_key": '["b"]'}, False)],
                           1).new_state
    tombstone = rules.apply('["pk"]', None, [change_of({**add, "sequence": "[1]"}, False),
                                             change_of({**add, "kind": "-D", "sequence": "[2]"}, False)], 1).new_state
    assert simple_outcome(rules, '["pk"]', two_rows, [add]) is None
    assert tombstone is not None and simple_outcome(rules, '["pk"]', tombstone, [add]) is None
    assert simple_outcome(rules, '["pk"]', None, [add, {**add, "upsert_key": '["b"]'}]) is None
    assert simple_outcome(rules, '["pk"]', None, [{**add, "sequence": "[1]"}]) is None
    assert simple_outcome(rules, '["pk"]', '{"v": 2, "l": []}', [add]) is None
    assert simple_outcome(rules, '["pk"]', None, [add]) is not None
