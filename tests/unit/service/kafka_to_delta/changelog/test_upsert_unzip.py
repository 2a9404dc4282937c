"""The previous-image stage (spec 4.1.2.2.2, 4.3.3): pure rules, state as text, TTL on a fake clock."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from service.kafka_to_delta.changelog.upsert_unzip import UpsertUnzip


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def change(kind: str, v, intent: str | None = None, offset: int = 0, ident: int = 1, unchanged=None) -> dict:
    row = {"id": ident} if v is None else {"id": ident, "v": v}
    return {
        "topic": "t", "partition": 0, "offset": offset, "change_index": 0, "kind": kind,
        "key": f"[{ident}]", "upsert_key": f"[{ident}]", "partition_key": f"[{ident}]",
        "row": json.dumps(row), "intent": intent, "unchanged": unchanged,
    }


def out(step) -> list[tuple]:
    return [(r["kind"], json.loads(r["row"])) for r in step.rows]


def test_upsert_is_an_insert_for_an_unseen_key_then_an_update():
    unzip = UpsertUnzip(ttl_seconds=60, clock=Clock())
    first = unzip.apply(None, [change("+U", "a", "upsert")])
    assert out(first) == [("+I", {"id": 1, "v": "a"})] and first.rows[0]["intent"] is None
    second = unzip.apply(first.state, [change("+U", "b", "upsert")])
    assert out(second) == [("+U", {"id": 1, "v": "b"})]


def test_upsert_retract_emits_the_previous_image_with_the_new_coordinates():
    unzip = UpsertUnzip(ttl_seconds=0)
    step = unzip.apply(None, [change("+U", "a", "upsert_retract", offset=1), change("+U", "b", "upsert_retract", 2)])
    assert out(step) == [("+I", {"id": 1, "v": "a"}), ("-U", {"id": 1, "v": "a"}), ("+U", {"id": 1, "v": "b"})]
    assert [r["offset"] for r in step.rows] == [1, 2, 2]
    assert json.loads(step.state)["expires_at_ms"] is None  # 0 keeps it forever


def test_update_retract_becomes_an_insert_when_the_image_is_gone():
    unzip = UpsertUnzip(ttl_seconds=0)
    assert out(unzip.apply(None, [change("+U", "b", "update_retract")])) == [("+I", {"id": 1, "v": "b"})]


def test_plain_kinds_pass_and_keep_the_state_current():
    unzip = UpsertUnzip(ttl_seconds=0)
    step = unzip.apply(None, [change("+I", "a"), change("-U", "a"), change("+U", "b")])
    assert out(step) == [("+I", {"id": 1, "v": "a"}), ("-U", {"id": 1, "v": "a"}), ("+U", {"id": 1, "v": "b"})]
    assert json.loads(unzip.previous(step.state)["row"]) == {"id": 1, "v": "b"}
    deleted = unzip.apply(step.state, [change("-D", None)])
    assert out(deleted) == [("-D", {"id": 1})] and deleted.state is None  # partial delete passes as it is
    assert unzip.apply(step.state, [{**change("-D", None), "kind": "TRUNCATE"}]).state is None


def test_unchanged_columns_are_filled_from_the_previous_image():
    unzip = UpsertUnzip(ttl_seconds=0)
    first = unzip.apply(None, [{**change("+I", None), "row": '{"id":1,"doc":"big","n":1}'}])
    update = {**change("+U", None, "update_retract"), "row": '{"id":1,"n":2}', "unchanged": '["doc","gone"]'}
    step = unzip.apply(first.state, [update])
    before, after = step.rows
    assert json.loads(before["row"]) == {"id": 1, "doc": "big", "n": 1} and before["unchanged"] is None
    assert json.loads(after["row"]) == {"id": 1, "n": 2, "doc": "big"} and after["unchanged"] == '["gone"]'
    assert json.loads(unzip.previous(step.state)["row"])["doc"] == "big"


def test_ttl_counts_from_the_last_access():
    clock = Clock(100.0)
    unzip = UpsertUnzip(ttl_seconds=10, clock=clock)
    state = unzip.apply(None, [change("+U", "a", "upsert")]).state
    assert unzip.expires_at_ms(state) == 110_000
    clock.now = 109.0
    state = unzip.apply(state, [change("+U", "b", "upsert")]).state  # refreshed
    assert unzip.expires_at_ms(state) == 119_000
    clock.now = 118.9
    assert unzip.previous(state) is not None
    clock.now = 119.0
    assert unzip.previous(state) is None
    assert out(unzip.apply(state, [change("+U", "c", "upsert_retract")])) == [("+I", {"id": 1, "v": "c"})]


def test_the_previous_key_is_kept_for_the_retraction():
    unzip = UpsertUnzip(ttl_seconds=0)
    first = unzip.apply(None, [{**change("+I", "a"), "key": '["old"]'}])
    step = unzip.apply(first.state, [{**change("+U", "b", "upsert_retract"), "key": '["new"]'}])
    assert [r["key"] for r in step.rows] == ['["old"]', '["new"]']


ops = st.lists(st.tuples(st.sampled_from(["upsert", "delete"]), st.integers(0, 3)), max_size=30)


@settings(max_examples=300, deadline=None)
@given(ops=ops, batch=st.integers(1, 4))
def test_output_is_a_consistent_retract_stream(ops, batch):
    """Whatever the upserts and deletes, each -U retracts exactly the live row and +I only starts a life."""
    unzip = UpsertUnzip(ttl_seconds=0)
    rows = [change("-D", v) if op == "delete" else change("+U", v, "upsert_retract") for op, v in ops]
    state, emitted = None, []
    for start in range(0, len(rows), batch):
        step = unzip.apply(state, rows[start:start + batch])
        state, emitted = step.state, emitted + step.rows
    live = None
    for row in emitted:
        image = json.loads(row["row"])
        if row["kind"] == "+I":
            assert live is None
            live = image
        elif row["kind"] == "-U":
            assert image == live
            live = None
        elif row["kind"] == "+U":
            assert live is None  # right after its -U
            live = image
        else:
            live = None
    expected = None
    for op, v in ops:
        expected = None if op == "delete" else {"id": 1, "v": v}
    assert live == expected
    assert (state is None) == (expected is None)
