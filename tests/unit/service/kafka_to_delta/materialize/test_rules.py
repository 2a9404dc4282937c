"""The keyed-state materializer: spec examples, on_conflict strategies, sequence_by, state round trip."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import pytest

from service.kafka_to_delta.materialize.key_state import (
    LiveRow,
    PkState,
    Tombstone,
    decode_state,
    encode_state,
)
from service.kafka_to_delta.materialize.rules import (
    Change,
    ConflictError,
    Counters,
    Materializer,
    MaterializerConfig,
    MaterializerError,
    NetChange,
    OnConflict,
)
from vocabulary.changes import ChangeKind
from vocabulary.errors import TerminalError
from vocabulary.redaction import fingerprint

INS, UB, UA, DEL = ChangeKind.INSERT, ChangeKind.UPDATE_BEFORE, ChangeKind.UPDATE_AFTER, ChangeKind.DELETE
STRATEGIES: tuple[OnConflict, ...] = ("error", "nothing", "deduplicate")


def canon(value: object) -> str:
    """Canonical JSON, as the adapter writes keys and rows."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass
class Harness:
    """Routes changes by primary key, keeps each key's state and applies net changes to a table."""

    materializer: Materializer
    states: dict[str, str] = field(default_factory=dict)
    table: dict[str, str] = field(default_factory=dict)
    totals: Counters = field(default_factory=Counters)

    def barrier(self, routed: list[tuple[str, Change]], now_ms: int = 0) -> dict[str, NetChange | None]:
        """One barrier: every change in `routed` (pk, change) became final, in this order."""
        by_pk: dict[str, list[Change]] = {}
        for pk, change in routed:
            by_pk.setdefault(pk, []).append(change)
        nets = {pk: self.apply(pk, changes, now_ms) for pk, changes in by_pk.items()}
        return nets

    def apply(self, pk: str, changes: list[Change], now_ms: int = 0) -> NetChange | None:
        outcome = self.materializer.apply(pk, self.states.get(pk), changes, now_ms)
        self.totals.add(outcome.counters)
        if outcome.new_state is None:
            self.states.pop(pk, None)
        else:
            self.states[pk] = outcome.new_state
        assert outcome.counters.state_bytes == len((outcome.new_state or "").encode())
        net = outcome.net
        if net is not None and net.kind == "upsert":
            assert self.table.get(pk) != net.row, "an upsert must change the table"
            self.table[pk] = net.row
        elif net is not None:
            assert pk in self.table, "a delete must remove a row the table holds"
            del self.table[pk]
        return net


def harness(on_conflict: OnConflict, retention_ms: int = 0) -> Harness:
    return Harness(Materializer(MaterializerConfig("t1", ("id",), on_conflict, retention_ms)))


# --- the join example (spec sink-upsert-materializer): pk id, no upsert key -------------------------

A1 = canon({"id": 1, "level": 10, "attr": "a1"})
B1 = canon({"id": 1, "level": 20, "attr": "b1"})


def whole(kind: ChangeKind, row: str, offset: int, partition: int) -> tuple[str, Change]:
    return "[1]", Change(kind, row, row, ("join", partition, offset), key_mode="whole_row")


JOIN_CASES = {
    "case1": [whole(INS, A1, 0, 0), whole(UB, A1, 1, 0), whole(UA, B1, 0, 1)],
    "case2": [whole(UA, B1, 0, 1), whole(INS, A1, 0, 0), whole(UB, A1, 1, 0)],
    "case3": [whole(INS, A1, 0, 0), whole(UA, B1, 0, 1), whole(UB, A1, 1, 0)],
}


@pytest.mark.parametrize("on_conflict", STRATEGIES)
@pytest.mark.parametrize("case", sorted(JOIN_CASES))
def test_join_example_one_barrier_ends_in_b1(case: str, on_conflict: OnConflict) -> None:
    h = harness(on_conflict)
    nets = h.barrier(JOIN_CASES[case])
    assert h.table == {"[1]": B1}
    assert nets == {"[1]": NetChange("upsert", B1)}  # one net change, no intermediate row
    assert decode_state(h.states["[1]"]).rows == [LiveRow(B1, B1, ("join", 1, 0), None, "whole_row")]


@pytest.mark.parametrize("case", sorted(JOIN_CASES))
def test_join_example_event_per_barrier_under_deduplicate(case: str) -> None:
    h = harness("deduplicate")
    shown = []
    for routed in JOIN_CASES[case]:
        h.barrier([routed])
        shown.append(h.table.get("[1]"))
    assert h.table == {"[1]": B1}
    expected = {"case1": [A1, None, B1], "case2": [B1, A1, B1], "case3": [A1, B1, B1]}[case]
    assert shown == expected
    assert h.totals.rollbacks == (1 if case == "case2" else 0)


def test_join_case3_per_barrier_under_nothing_shows_the_barrier_assumption() -> None:
    # Documented: `nothing` forgets the conflicting row, so a barrier between -U and +U loses it.
    h = harness("nothing")
    for routed in JOIN_CASES["case3"]:
        h.barrier([routed])
    assert h.table == {} and h.totals.conflicts == 1 and h.states == {}


# --- the Football rollback (spec on-conflict) --------------------------------------------------------


def football(kind: ChangeKind, product_id: int, quantity: int, offset: int) -> tuple[str, Change]:
    row = canon({"name": "Football", "quantity": quantity})
    return '["Football"]', Change(kind, canon([product_id]), row, ("orders", 0, offset))


def test_football_rollback_under_deduplicate() -> None:
    h = harness("deduplicate")
    events = [football(UA, 1, 5, 1), football(UA, 2, 6, 2), football(UB, 2, 6, 3)]
    outputs = [h.barrier([event])['["Football"]'] for event in events]
    five, six = canon({"name": "Football", "quantity": 5}), canon({"name": "Football", "quantity": 6})
    assert outputs == [NetChange("upsert", five), NetChange("upsert", six), NetChange("upsert", five)]
    assert h.totals.rollbacks == 1 and h.table == {'["Football"]': five}
    assert h.barrier([football(UB, 1, 5, 4)]) == {'["Football"]': NetChange("delete", None)}
    assert h.states == {} and h.table == {}


# --- fan-in: two topics carry primary key 7 ------------------------------------------------------------

SECRET_A = canon({"id": 7, "email": "alice@example.com"})
SECRET_B = canon({"id": 7, "email": "bob@example.com"})


def from_topic(kind: ChangeKind, topic: str, row: str, offset: int) -> tuple[str, Change]:
    return "[7]", Change(kind, canon([topic, 7]), row, (topic, 3, offset))


def test_fan_in_error_names_key_and_both_topics_without_row_contents() -> None:
    h = harness("error")
    h.barrier([from_topic(INS, "topicA", SECRET_A, 11)])
    with pytest.raises(ConflictError) as caught:
        h.barrier([from_topic(INS, "topicB", SECRET_B, 22)])
    message = str(caught.value)
    assert isinstance(caught.value, TerminalError)
    # Key values are personal data: a stable fingerprint by default (log_values: false).
    assert "t1" in message and f"(id) = <redacted #{fingerprint('[7]')}>" in message and "[7]" not in message
    assert f"<redacted #{fingerprint(canon(['topicA', 7]))}>" in message and "topic=topicA partition=3 offset=11" in message
    assert f"<redacted #{fingerprint(canon(['topicB', 7]))}>" in message and "topic=topicB partition=3 offset=22" in message
    assert "alice" not in message and "bob" not in message
    assert h.table == {"[7]": SECRET_A}  # the failed barrier changed nothing


def test_fan_in_nothing_keeps_the_first() -> None:
    h = harness("nothing")
    h.barrier([from_topic(INS, "topicA", SECRET_A, 1)])
    assert h.barrier([from_topic(INS, "topicB", SECRET_B, 1)]) == {"[7]": None}
    assert h.table == {"[7]": SECRET_A} and h.totals.conflicts == 1
    assert len(decode_state(h.states["[7]"]).rows) == 1  # the loser is not remembered
    newer_a = canon({"id": 7, "email": "alice@new.example"})
    h.barrier([from_topic(UB, "topicA", SECRET_A, 2), from_topic(UA, "topicA", newer_a, 3)])
    assert h.table == {"[7]": newer_a}
    h.barrier([from_topic(DEL, "topicA", newer_a, 4)])
    assert h.table == {} and h.states == {}


def test_fan_in_deduplicate_shows_latest_and_rolls_back() -> None:
    h = harness("deduplicate")
    h.barrier([from_topic(INS, "topicA", SECRET_A, 1)])
    h.barrier([from_topic(INS, "topicB", SECRET_B, 1)])
    assert h.table == {"[7]": SECRET_B}
    h.barrier([from_topic(DEL, "topicB", SECRET_B, 2)])
    assert h.table == {"[7]": SECRET_A} and h.totals.rollbacks == 1


def test_deduplicate_replaces_in_place_keeping_arrival_order() -> None:
    h = harness("deduplicate")
    h.barrier([from_topic(INS, "topicA", SECRET_A, 1), from_topic(INS, "topicB", SECRET_B, 1)])
    newer_a = canon({"id": 7, "email": "alice@new.example"})
    assert h.barrier([from_topic(UA, "topicA", newer_a, 2)]) == {"[7]": None}  # not the last: table unchanged
    h.barrier([from_topic(DEL, "topicB", SECRET_B, 2)])
    assert h.table == {"[7]": newer_a}


def test_nothing_keeps_the_winner_updated_in_the_same_barrier_as_a_newcomer() -> None:
    h = harness("nothing")
    h.barrier([from_topic(INS, "topicA", SECRET_A, 1)])
    newer_a = canon({"id": 7, "email": "alice@new.example"})
    h.barrier(
        [
            from_topic(INS, "topicB", SECRET_B, 1),
            from_topic(UB, "topicA", SECRET_A, 2),
            from_topic(UA, "topicA", newer_a, 3),
        ]
    )
    assert h.table == {"[7]": newer_a} and h.totals.conflicts == 1


def test_nothing_winner_gone_earliest_arrived_wins() -> None:
    h = harness("nothing")
    h.barrier([from_topic(INS, "topicA", SECRET_A, 1)])
    third = canon({"id": 7, "email": "carol@example.com"})
    h.barrier(
        [
            from_topic(INS, "topicB", SECRET_B, 1),
            from_topic(INS, "topicC", third, 1),
            from_topic(DEL, "topicA", SECRET_A, 2),
        ]
    )
    assert h.table == {"[7]": SECRET_B} and h.totals.conflicts == 1


# --- email-keyed table fed by id-keyed changes ----------------------------------------------------------


def by_email(kind: ChangeKind, id_: int, email: str, offset: int) -> tuple[str, Change]:
    return canon([email]), Change(kind, canon([id_]), canon({"id": id_, "email": email}), ("users", 0, offset))


def test_email_swap_in_one_transaction_is_no_conflict() -> None:
    h = harness("error")
    h.barrier([by_email(INS, 1, "a@x", 0), by_email(INS, 2, "b@x", 1)])
    swap = [by_email(UB, 1, "a@x", 2), by_email(UA, 1, "b@x", 2), by_email(UB, 2, "b@x", 3), by_email(UA, 2, "a@x", 3)]
    h.barrier(swap)
    assert h.table == {
        canon(["a@x"]): canon({"id": 2, "email": "a@x"}),
        canon(["b@x"]): canon({"id": 1, "email": "b@x"}),
    }
    split = Harness(Materializer(MaterializerConfig("t1", ("id",), "error", log_values=True)))
    split.barrier([by_email(INS, 1, "a@x", 0), by_email(INS, 2, "b@x", 1)])
    with pytest.raises(ConflictError, match=r"upsert key \[1\].*upsert key \[2\]|upsert key \[2\].*upsert key \[1\]"):
        split.barrier(swap[:2])  # a barrier inside the transaction sees b@x twice


# --- sequence_by -----------------------------------------------------------------------------------------

ROW_OLD = canon({"id": 1, "v": "old"})
ROW_NEW = canon({"id": 1, "v": "new"})


def seq(kind: ChangeKind, row: str, sequence: int, offset: int, partition: int = 0) -> Change:
    return Change(kind, "[1]", row, ("cdc", partition, offset), (sequence,))


def test_late_older_upsert_after_delete_does_not_resurrect_within_retention() -> None:
    h = harness("error", retention_ms=1000)
    h.apply("[1]", [seq(INS, ROW_NEW, 5, 0)], now_ms=0)
    h.apply("[1]", [seq(DEL, ROW_NEW, 7, 1)], now_ms=100)
    assert h.table == {} and "[1]" in h.states  # the tombstone is kept
    h.apply("[1]", [seq(UA, ROW_OLD, 6, 2)], now_ms=1099)
    assert h.table == {} and h.totals.stale_dropped == 1


def test_late_older_upsert_after_retention_is_applied() -> None:
    h = harness("error", retention_ms=1000)
    h.apply("[1]", [seq(INS, ROW_NEW, 5, 0)], now_ms=0)
    outcome = h.materializer.apply("[1]", h.states["[1]"], [seq(DEL, ROW_NEW, 7, 1)], now_ms=100)
    assert outcome.wake_at_ms == 1100 and outcome.counters.tombstones == 1
    h.apply("[1]", [seq(DEL, ROW_NEW, 7, 1)], now_ms=100)
    h.apply("[1]", [seq(UA, ROW_OLD, 6, 2)], now_ms=1100)
    assert h.table == {"[1]": ROW_OLD} and h.totals.stale_dropped == 0


def test_tombstone_is_pruned_after_retention_and_state_dropped() -> None:
    h = harness("nothing", retention_ms=1000)
    h.apply("[1]", [seq(INS, ROW_NEW, 5, 0), seq(DEL, ROW_NEW, 7, 1)], now_ms=0)
    assert "[1]" in h.states
    h.apply("[1]", [], now_ms=999)
    assert "[1]" in h.states
    h.apply("[1]", [], now_ms=1000)
    assert h.states == {}


def test_retention_zero_keeps_tombstones_forever() -> None:
    h = harness("deduplicate", retention_ms=0)
    h.apply("[1]", [seq(INS, ROW_NEW, 5, 0), seq(DEL, ROW_NEW, 7, 1)], now_ms=0)
    h.apply("[1]", [seq(INS, ROW_OLD, 6, 2)], now_ms=10**12)
    assert h.table == {} and h.totals.stale_dropped == 1
    assert decode_state(h.states["[1]"]).tombstones == {"[1]": Tombstone((7,), ("cdc", 0, 1), 0)}


def test_stale_older_update_is_dropped() -> None:
    h = harness("error")
    h.apply("[1]", [seq(UA, ROW_NEW, 9, 5)])
    assert h.apply("[1]", [seq(UA, ROW_OLD, 8, 6)]) is None
    assert h.table == {"[1]": ROW_NEW} and h.totals.stale_dropped == 1


def test_stale_older_delete_is_dropped() -> None:
    h = harness("error")
    h.apply("[1]", [seq(UA, ROW_NEW, 9, 5)])
    assert h.apply("[1]", [seq(DEL, ROW_NEW, 8, 6)]) is None
    assert h.table == {"[1]": ROW_NEW} and h.totals.stale_dropped == 1


def test_equal_sequences_are_ordered_by_position() -> None:
    h = harness("error")
    h.apply("[1]", [seq(UA, ROW_NEW, 9, 5, partition=1)])
    h.apply("[1]", [seq(UA, ROW_OLD, 9, 7, partition=0)])  # same sequence, earlier partition: older
    assert h.table == {"[1]": ROW_NEW} and h.totals.stale_dropped == 1
    h.apply("[1]", [seq(UA, ROW_OLD, 9, 6, partition=1)])  # same sequence, later offset: newer
    assert h.table == {"[1]": ROW_OLD} and h.totals.stale_dropped == 1


def test_update_pair_from_one_record_is_applied() -> None:
    # -U and +U of one Debezium update share sequence and position.
    h = harness("error")
    h.apply("[1]", [seq(INS, ROW_OLD, 1, 0)])
    h.apply("[1]", [seq(UB, ROW_OLD, 2, 1), seq(UA, ROW_NEW, 2, 1)])
    assert h.table == {"[1]": ROW_NEW}
    assert decode_state(h.states["[1]"]).tombstones == {}  # the add superseded the tombstone


def test_incomparable_sequences_are_a_clear_error() -> None:
    h = harness("error")
    h.apply("[1]", [seq(UA, ROW_NEW, 9, 5)])
    bad = Change(UA, "[1]", ROW_OLD, ("cdc", 0, 6), ("lsn-text",))
    with pytest.raises(MaterializerError, match="offset=6.*offset=5.*cannot be compared"):
        h.apply("[1]", [bad])


# --- retractions without state, strategies, net changes ----------------------------------------------------


@pytest.mark.parametrize("on_conflict", STRATEGIES)
def test_retraction_without_state_is_counted_and_logged(on_conflict: OnConflict, caplog) -> None:
    h = harness(on_conflict)
    with caplog.at_level(logging.WARNING, logger="service.kafka_to_delta.materialize.rules"):
        assert h.apply("[7]", [Change(DEL, "[7]", SECRET_A, ("users", 2, 40))]) is None
    assert h.totals.cleared_state_warnings == 1 and h.states == {} and h.table == {}
    text = caplog.text
    assert "t1" in text and fingerprint("[7]") in text and "offset=40" in text and "alice" not in text
    assert "[7]" not in text


def test_whole_row_duplicates_conflict_without_row_contents() -> None:
    h = harness("error")
    with pytest.raises(ConflictError) as caught:
        h.barrier([whole(INS, A1, 0, 0), whole(INS, A1, 1, 0)])
    assert "a1" not in str(caught.value) and "whole-row key from topic=join partition=0 offset=1" in str(caught.value)


def test_whole_row_retraction_removes_one_duplicate() -> None:
    h = harness("deduplicate")
    h.barrier([whole(INS, A1, 0, 0), whole(INS, A1, 1, 0), whole(UB, A1, 2, 0)])
    assert h.table == {"[1]": A1}
    assert decode_state(h.states["[1]"]).rows == [LiveRow(A1, A1, ("join", 0, 1), None, "whole_row")]  # first went


@pytest.mark.parametrize("on_conflict", STRATEGIES)
def test_same_row_again_is_no_net_change_and_delete_ends_state(on_conflict: OnConflict) -> None:
    h = harness(on_conflict)
    assert h.barrier([from_topic(INS, "topicA", SECRET_A, 1)]) == {"[7]": NetChange("upsert", SECRET_A)}
    assert h.barrier([from_topic(UA, "topicA", SECRET_A, 2)]) == {"[7]": None}
    assert h.barrier([from_topic(DEL, "topicA", SECRET_A, 3)]) == {"[7]": NetChange("delete", None)}
    assert h.states == {} and h.table == {}


def test_insert_and_delete_in_one_barrier_leave_nothing() -> None:
    h = harness("error")
    assert h.barrier([from_topic(INS, "topicA", SECRET_A, 1), from_topic(DEL, "topicA", SECRET_A, 2)]) == {"[7]": None}
    assert h.states == {} and h.table == {}


def test_counters_describe_the_state() -> None:
    outcome = Materializer(MaterializerConfig("t1", ("id",), "deduplicate")).apply(
        "[7]", None, [from_topic(INS, "topicA", SECRET_A, 1)[1], from_topic(INS, "topicB", SECRET_B, 1)[1]], 0
    )
    assert outcome.counters.live_rows == 2 and outcome.counters.tombstones == 0
    assert outcome.counters.state_bytes == len(outcome.new_state.encode()) > 0
    assert outcome.wake_at_ms is None


def test_string_kinds_are_accepted() -> None:
    assert Change("+U", "[1]", ROW_NEW, ("t", 0, 0)).kind is ChangeKind.UPDATE_AFTER
    with pytest.raises(ValueError):
        Change("x", "[1]", ROW_NEW, ("t", 0, 0))


def test_config_is_validated() -> None:
    with pytest.raises(TerminalError, match="on_conflict"):
        MaterializerConfig("t1", ("id",), "ignore")  # type: ignore[arg-type]
    with pytest.raises(TerminalError, match="tombstone_retention_ms"):
        MaterializerConfig("t1", ("id",), "error", -1)


# --- state text form --------------------------------------------------------------------------------------


def test_state_round_trip() -> None:
    state = PkState(
        rows=[
            LiveRow('["topicA",7]', SECRET_A, ("topicA", 0, 3), (12, "x"), "upsert_key"),
            LiveRow(A1, A1, ("join", 1, 4), None, "whole_row"),
            LiveRow(B1, canon({"attr": "b1", "id": 1, "level": 20, "extra": None}), ("join", 1, 5), None, "whole_row"),
        ],
        tombstones={'["topicB",7]': Tombstone((11, "y"), ("topicB", 2, 9), 1234)},
    )
    text = encode_state(state)
    assert decode_state(text) == state
    assert encode_state(decode_state(text)) == text
    assert text.count("level") == 3  # a whole-row key equal to its row is stored once


def test_apply_through_text_equals_apply_in_one_go() -> None:
    changes = [c for _, c in JOIN_CASES["case2"]]
    m = Materializer(MaterializerConfig("t1", ("id",), "deduplicate"))
    state = None
    for change in changes:
        state = m.apply("[1]", state, [change], 0).new_state
    assert decode_state(state) == decode_state(m.apply("[1]", None, changes, 0).new_state)


@pytest.mark.parametrize("bad", ["not json", '{"v": 99, "l": []}', '{"v": 1}', '{"v": 1, "l": [{"r": 1}]}', "[]"])
def test_unreadable_state_is_a_terminal_error_naming_the_key(bad: str) -> None:
    m = Materializer(MaterializerConfig("t1", ("id",), "error"))
    with pytest.raises(MaterializerError, match=rf"table t1, primary key <redacted #{fingerprint('[7]')}>: stored state") as caught:
        m.apply("[7]", bad, [], 0)
    assert bad not in str(caught.value)
