"""Row digests in the materializer's state (`row_digest`, `StageConfig.row_digests`) against row texts.

Where a primary key can hold one live row at most (one topic, upsert key = primary key), the rules keep
digests of rows instead of their text. Random runs of micro-batches over a few keys, under each
on_conflict strategy, with and without sequence_by and TOAST placeholders, go through `compact_many`
twice, with row texts and with digests: every net row must be the same (its state size aside), and the
kept states smaller. A run also switches from texts to digests half-way, as a checkpoint written before
does. Fixed seeds, plus one random seed (in the test id)."""

from __future__ import annotations

import random

import orjson
import pytest

from service.config.settings import settings_from_mapping
from service.kafka_to_delta.materialize.bulk import compact_many
from service.kafka_to_delta.materialize.key_state import (
    LiveRow,
    PkState,
    Tombstone,
    decode_state,
    encode_state,
)
from service.kafka_to_delta.materialize.row_digest import digested_state, is_digest, row_digest
from service.kafka_to_delta.materialize.rules import (
    Materializer,
    MaterializerConfig,
    MaterializerError,
)
from service.kafka_to_delta.pipeline import stage_config
from service.kafka_to_delta.plan.checkpoint_state import OldState
from service.kafka_to_delta.plan.state_rebuild import seed_states
from service.kafka_to_delta.rows.names import EVENT_TIME, GROUP
from tests.support.run_seed import run_seed

SEEDS = [0, 1, 2, 7, 42, 1234]
STRATEGIES = ["error", "nothing", "deduplicate"]
PLACEHOLDER = "__debezium_unavailable_value"


def _record(rnd: random.Random, offset: int, pk: int, sequenced: bool) -> dict:
    kind = rnd.choice(["+I", "+U", "+U", "-U", "-D", "+U"])
    row = {"id": pk, "v": rnd.randint(0, 1), "notes": rnd.choice(["x" * 3000, PLACEHOLDER])}  # rows often repeat
    unchanged = '["notes"]' if row["notes"] == PLACEHOLDER and kind == "+U" else None
    key = orjson.dumps([pk]).decode()
    return {GROUP: key, "kind": kind, "upsert_key": key, "row": orjson.dumps(row).decode(), "unchanged": unchanged,
            "types": None, "topic": "db.public.accounts", "partition": 0, "offset": offset, "change_index": 0,
            "timestamp": 1_000 + offset, EVENT_TIME: 1_000 + offset,
            "sequence": orjson.dumps([rnd.randint(0, 6)]).decode() if sequenced else None}


def _batches(seed: int) -> list[list[dict]]:
    rnd = random.Random(seed)
    sequenced = rnd.random() < 0.5
    offset, batches = 0, []
    for _ in range(40):
        batch = [_record(rnd, offset + i, rnd.randint(1, 5), sequenced) for i in range(rnd.randint(1, 12))]
        offset += len(batch)
        batches.append(batch)
    return batches


def _without_state_size(rows: list[dict]) -> list[dict]:
    return sorted(({k: v for k, v in row.items() if k != "state_bytes"} for row in rows), key=lambda r: r["key"])


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("seed", [*SEEDS, run_seed(2**32)])
def test_digests_decide_every_micro_batch_as_row_texts_do(seed, strategy):
    rules = Materializer(MaterializerConfig("accounts", ("id",), strategy, tombstone_retention_ms=50))
    texts: dict = {}
    digests: dict = {}
    switched: dict = {}  # row texts for the first half, then digests (a checkpoint written before)
    batches = _batches(seed)
    for number, batch in enumerate(batches):
        expected = compact_many(rules, batch, texts, False, 0)
        assert _without_state_size(compact_many(rules, batch, digests, False, 0, True)) == _without_state_size(expected)
        late = number >= len(batches) // 2
        assert _without_state_size(compact_many(rules, batch, switched, False, 0, late)) == _without_state_size(expected)
        assert digests.keys() == texts.keys()
    assert texts, "the runs end with live keys"
    for key, (state, _) in digests.items():
        assert len(state) <= len(texts[key][0])
        assert all(is_digest(live.row) for live in decode_state(state).rows)
    assert sum(len(s) for s, _ in digests.values()) < sum(len(s) for s, _ in texts.values())


@pytest.mark.parametrize("sequenced", [False, True])
def test_a_row_stored_as_text_before_is_not_written_again_when_it_arrives_again(sequenced):
    # A checkpoint written before digests holds the row's text; the same row arriving again changes nothing.
    rules = Materializer(MaterializerConfig("accounts", ("id",), "error"))
    add = _record(random.Random(3), 1, 1, sequenced)
    add["kind"] = "+I"
    states: dict = {}
    assert compact_many(rules, [add], states, False, 0)[0]["kind"] == "+U"
    again = {**add, "kind": "+U", "offset": 2, "timestamp": 1_002}
    assert compact_many(rules, [again], states, False, 0, True)[0]["kind"] is None
    assert is_digest(decode_state(states[add[GROUP]][0]).rows[0].row)


def test_a_row_of_an_earlier_micro_batch_cannot_be_restored_from_a_digest():
    # Two upsert keys for one primary key: a configuration that never gets digests (one topic, upsert key =
    # primary key). Forced here, the rollback under `deduplicate` has no text to write back, and says so.
    rules = Materializer(MaterializerConfig("accounts", ("id",), "deduplicate"))
    first, second = _record(random.Random(1), 1, 1, False), _record(random.Random(2), 2, 1, False)
    first.update(kind="+I", upsert_key='["a"]')
    second.update(kind="+I", upsert_key='["b"]')
    states: dict = {}
    compact_many(rules, [first, second], states, False, 0, True)
    retract = {**second, "kind": "-U", "offset": 3, "timestamp": 1_003}
    with pytest.raises(MaterializerError, match=r"table accounts, primary key .*earlier micro-batch.*digest"):
        compact_many(rules, [retract], states, False, 0, True)
    texts: dict = {}
    compact_many(rules, [first, second], texts, False, 0)
    assert compact_many(rules, [retract], texts, False, 0)[0]["row"] == first["row"]  # rows kept: it rolls back


def test_a_stored_state_is_digested_once_and_keeps_its_tombstones():
    live = LiveRow('["1"]', '{"id": 1, "notes": "long"}', ("t", 0, 5), (3,))
    text = encode_state(PkState([live], {'["2"]': Tombstone((4,), ("t", 0, 6), 99)}))
    digested = digested_state(text)
    state = decode_state(digested)
    assert state.rows[0].row == row_digest(live.row) and state.rows[0].position == live.position
    assert state.tombstones == decode_state(text).tombstones
    assert digested_state(digested) is digested and digested_state(None) is None


def _pipeline(**extra):
    pipeline = {"name": "p", "topics": ["t"], "table": "accounts", "primary_key": ["id"],
                "upsert_materialize": "force", "on_conflict": "deduplicate", **extra}
    return settings_from_mapping({"pipelines": [pipeline]}).pipelines[0]


def test_digests_are_kept_only_where_a_key_holds_one_live_row():
    assert stage_config(_pipeline()).row_digests
    assert stage_config(_pipeline(sequence_by=["ts"])).row_digests
    assert not stage_config(_pipeline(topics=["t", "u"])).row_digests
    assert not stage_config(_pipeline(upsert_key=["email"])).row_digests
    assert not stage_config(_pipeline(upsert_key=[])).row_digests


def test_a_rebuild_for_two_topics_takes_the_row_text_from_the_table_where_the_old_state_kept_a_digest():
    row = {"id": 1, "notes": "long"}
    old_live = LiveRow('["1"]', row_digest(orjson.dumps(row).decode()), ("t", 0, 5))
    for pipeline, digest_kept in ((_pipeline(), True), (_pipeline(topics=["t", "u"]), False)):
        old = OldState({'[1]': old_live}, {})
        seeded = decode_state(seed_states([row], pipeline, 0, old)["state"][0]).rows[0]
        assert seeded.position == old_live.position
        assert is_digest(seeded.row) is digest_kept
        if not digest_kept:
            assert orjson.loads(seeded.row) == row
