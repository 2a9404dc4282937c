"""The regular join's rules without Spark: one batch at a time, the output applied to a dict as the
Delta MERGE would apply it, compared with the join of the final source tables."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest

from service.kafka_to_delta.joins.regular_join_rules import (
    JoinRules,
    JoinState,
    SideRules,
    join_step,
    side_changes,
)
from service.kafka_to_delta.materialize.rules import ConflictError, MaterializerConfig
from service.kafka_to_delta.rows.names import Column
from tests.support.join_reference import normalized, reference_join
from tests.support.run_seed import run_seed

ORDERS = SideRules(("order_id",), ("customer_id",))
CUSTOMERS = SideRules(("customer_id",), ("customer_id",))
COLUMNS = ("order_id", "customer_id", "amount", "customer_id0", "name")
_SCHEMA = pa.schema([
    (Column.TOPIC, pa.string()), (Column.PARTITION, pa.int32()), (Column.OFFSET, pa.int64()),
    (Column.CHANGE_INDEX, pa.int32()), (Column.TIMESTAMP, pa.int64()), (Column.KIND, pa.string()),
    (Column.KEY, pa.string()), (Column.ROW, pa.string()), (Column.TYPES, pa.string()),
    (Column.EVENT_TIME, pa.int64()), (Column.UNCHANGED, pa.string()),
])


def rules(outer: bool, key: tuple[str, ...] = ("order_id",), on_conflict: str = "error",
          left_ttl: int = 0, right_ttl: int = 0) -> JoinRules:
    return JoinRules(
        left=SideRules(ORDERS.primary_key, ORDERS.join_key, left_ttl),
        right=SideRules(CUSTOMERS.primary_key, CUSTOMERS.join_key, right_ttl),
        outer=outer, output=MaterializerConfig("out", key, on_conflict),  # type: ignore[arg-type]
    )


class Run:
    """Feeds batches to the rules and keeps the output table as a dict (output key -> row)."""

    def __init__(self, join_rules: JoinRules) -> None:
        self.rules = join_rules
        self.state = JoinState()
        self.table: dict[str, dict] = {}
        self.offsets: dict[tuple[str, int], int] = {}
        self.expired = 0

    def change(self, topic: str, kind: str, pk: int, row: dict | None, ts: int, partition: int = 0,
               unchanged: list[str] | None = None) -> dict:
        offset = self.offsets.get((topic, partition), 0)
        self.offsets[(topic, partition)] = offset + 1
        return {Column.TOPIC: topic, Column.PARTITION: partition, Column.OFFSET: offset, Column.CHANGE_INDEX: 0,
                Column.TIMESTAMP: ts, Column.KIND: kind, Column.KEY: f"[{pk}]",
                Column.ROW: None if row is None else json.dumps(row), Column.TYPES: None, Column.EVENT_TIME: None,
                Column.UNCHANGED: json.dumps(unchanged) if unchanged else None}

    def batch(self, left: list[dict], right: list[dict]) -> pa.Table:
        step = join_step(self.state, side_changes(pa.Table.from_pylist(left, _SCHEMA), self.rules.left),
                         side_changes(pa.Table.from_pylist(right, _SCHEMA), self.rules.right), self.rules)
        self.state = step.state
        self.expired += step.expired
        for change in step.output.to_pylist():
            if change["kind"] == "-D":
                self.table.pop(change["key"], None)
            else:
                self.table[change["key"]] = json.loads(change["row"])
        return step.output

    def rows(self) -> list[tuple]:
        return normalized(list(self.table.values()), COLUMNS)


def order(order_id: int, customer_id: int | None, amount: int = 10) -> dict:
    return {"order_id": order_id, "customer_id": customer_id, "amount": amount}


def customer(customer_id: int, name: str) -> dict:
    return {"customer_id": customer_id, "name": name}


def test_inner_join_follows_updates_and_deletes_of_both_sides():
    run = Run(rules(outer=False))
    run.batch([run.change("o", "+I", 1, order(1, 7), 0), run.change("o", "+I", 2, order(2, 7), 0)],
              [run.change("c", "+I", 7, customer(7, "ann"), 0)])
    assert run.rows() == [(1, 7, 10, 7, "ann"), (2, 7, 10, 7, "ann")]
    run.batch([], [run.change("c", "-U", 7, customer(7, "ann"), 1), run.change("c", "+U", 7, customer(7, "bo"), 1)])
    assert run.rows() == [(1, 7, 10, 7, "bo"), (2, 7, 10, 7, "bo")]
    run.batch([run.change("o", "+U", 1, order(1, 7, 99), 2)], [])
    assert run.rows() == [(1, 7, 99, 7, "bo"), (2, 7, 10, 7, "bo")]
    run.batch([], [run.change("c", "-D", 7, customer(7, "bo"), 3)])
    assert run.rows() == []


def test_left_join_nulls_until_a_match_and_back_to_nulls_when_it_goes():
    run = Run(rules(outer=True))
    run.batch([run.change("o", "+I", 1, order(1, 7), 0), run.change("o", "+I", 2, order(2, None), 0)], [])
    assert run.rows() == [(1, 7, 10, None, None), (2, None, 10, None, None)]
    run.batch([], [run.change("c", "+I", 7, customer(7, "ann"), 1)])
    assert run.rows() == [(1, 7, 10, 7, "ann"), (2, None, 10, None, None)]
    run.batch([], [run.change("c", "-D", 7, None, 2)])
    assert run.rows() == [(1, 7, 10, None, None), (2, None, 10, None, None)]
    run.batch([run.change("o", "-D", 2, None, 3)], [])
    assert run.rows() == [(1, 7, 10, None, None)]


def test_an_order_moving_to_another_customer_and_a_primary_key_change():
    run = Run(rules(outer=False))
    run.batch([run.change("o", "+I", 1, order(1, 7), 0)],
              [run.change("c", "+I", 7, customer(7, "ann"), 0), run.change("c", "+I", 8, customer(8, "bo"), 0)])
    run.batch([run.change("o", "+U", 1, order(1, 8), 1)], [])
    assert run.rows() == [(1, 8, 10, 8, "bo")]
    # Key change: delete of order 1 in partition 0, create of order 5 in partition 1, in one batch.
    run.batch([run.change("o", "+I", 5, order(5, 8), 2, partition=1), run.change("o", "-D", 1, None, 2)], [])
    assert run.rows() == [(5, 8, 10, 8, "bo")]
    # Customer key change 8 -> 9 and the order follows in the same batch.
    run.batch([run.change("o", "+U", 5, order(5, 9), 3, partition=1)],
              [run.change("c", "-D", 8, None, 3), run.change("c", "+I", 9, customer(9, "bo"), 3, partition=1)])
    assert run.rows() == [(5, 9, 10, 9, "bo")]


def test_the_last_change_per_key_wins_in_source_order():
    run = Run(rules(outer=False))
    changes = [run.change("o", "+I", 1, order(1, 7, 1), 0), run.change("o", "+U", 1, order(1, 7, 2), 0),
               run.change("o", "-D", 1, None, 0), run.change("o", "+I", 1, order(1, 7, 3), 0)]
    run.batch(list(reversed(changes)), [run.change("c", "+I", 7, customer(7, "ann"), 0)])
    assert run.rows() == [(1, 7, 3, 7, "ann")]


def test_columns_a_toast_placeholder_left_out_come_from_the_previous_image():
    run = Run(rules(outer=False))
    run.batch([run.change("o", "+I", 1, order(1, 7), 0)],
              [run.change("c", "+I", 7, customer(7, "ann"), 0),  # the same batch: from its earlier image
               run.change("c", "+U", 7, {"customer_id": 7}, 0, unchanged=["name"])])
    assert run.rows() == [(1, 7, 10, 7, "ann")]
    run.batch([run.change("o", "+U", 1, {"order_id": 1, "customer_id": 7}, 1, unchanged=["amount"])],
              [run.change("c", "+U", 7, {"customer_id": 7}, 1, unchanged=["name"])])  # from the state
    assert run.rows() == [(1, 7, 10, 7, "ann")]


def test_expired_right_row_is_never_seen_again_and_its_expiry_retracts_nothing():
    for outer, expected in ((False, []), (True, [(2, 7, 10, None, None)])):
        run = Run(rules(outer=outer, left_ttl=100_000, right_ttl=10_000))
        run.batch([run.change("o", "+I", 1, order(1, 7), 0)], [run.change("c", "+I", 7, customer(7, "ann"), 0)])
        run.batch([run.change("o", "+I", 2, order(2, 7), 50_000)], [])  # the clock passes the right TTL
        assert run.expired == 1
        assert run.rows() == sorted([(1, 7, 10, 7, "ann"), *expected], key=repr)  # (1, 7) is not retracted


def test_a_left_row_changed_after_its_match_expired_replaces_the_stale_row_without_conflict():
    run = Run(rules(outer=True, right_ttl=10_000))  # output keyed by order_id, on_conflict error
    run.batch([run.change("o", "+I", 1, order(1, 7), 0)], [run.change("c", "+I", 7, customer(7, "ann"), 0)])
    run.batch([run.change("o", "+I", 2, order(2, 8), 50_000)], [])  # customer 7 expires: nothing emitted
    assert run.rows() == [(1, 7, 10, 7, "ann"), (2, 8, 10, None, None)]
    run.batch([run.change("o", "+U", 1, order(1, 7, 99), 60_000)], [])  # no live match any more: nulls
    assert run.rows() == [(1, 7, 99, None, None), (2, 8, 10, None, None)]


def test_left_rows_expire_by_their_own_ttl():
    run = Run(rules(outer=False, left_ttl=10_000, right_ttl=100_000))
    run.batch([run.change("o", "+I", 1, order(1, 7), 0)], [])
    run.batch([], [run.change("c", "+I", 7, customer(7, "ann"), 20_000)])  # order 1 expired first
    assert run.rows() == [] and run.expired == 1
    run.batch([run.change("o", "+I", 3, order(3, 7), 25_000)], [])
    assert run.rows() == [(3, 7, 10, 7, "ann")]


def test_declared_key_with_two_live_rows_follows_on_conflict():
    # Output keyed by customer only: two orders of one customer are two live rows for the key.
    customers_key = ("customer_id",)
    failing = Run(rules(outer=False, key=customers_key, on_conflict="error"))
    with pytest.raises(ConflictError):
        failing.batch([failing.change("o", "+I", 1, order(1, 7), 0), failing.change("o", "+I", 2, order(2, 7), 0)],
                      [failing.change("c", "+I", 7, customer(7, "ann"), 0)])
    run = Run(rules(outer=False, key=customers_key, on_conflict="deduplicate"))
    run.batch([run.change("o", "+I", 1, order(1, 7, 1), 0)], [run.change("c", "+I", 7, customer(7, "ann"), 0)])
    run.batch([run.change("o", "+I", 2, order(2, 7, 2), 1)], [])
    assert [r[2] for r in run.rows()] == [2]
    run.batch([run.change("o", "-D", 2, None, 2)], [])  # rolls back to order 1
    assert [r[2] for r in run.rows()] == [1]


def random_changes(run: Run, rng: random.Random, topic: str, table: dict[int, dict], keys: int, partitions: int,
                   new_row, moment: int, count: int, delete_share: float) -> list[dict]:
    """`count` random upserts and deletes of `table` (pk -> row), applied to it; the changes they make."""
    changes = []
    for _ in range(count):
        pk = rng.randrange(keys)
        if pk in table and rng.random() < delete_share:
            del table[pk]
            changes.append(run.change(topic, "-D", pk, None, moment, partition=pk % partitions))
        else:
            table[pk] = new_row(pk)
            kind = "+U" if rng.random() < 0.5 else "+I"
            changes.append(run.change(topic, kind, pk, table[pk], moment, partition=pk % partitions))
    return changes


@pytest.mark.parametrize("seed", [1, 2, 3, run_seed(1_000_000)])
@pytest.mark.parametrize("outer", [False, True])
def test_random_batches_equal_the_join_of_the_final_tables(seed, outer):
    rng = random.Random(seed)
    run = Run(rules(outer=outer, key=("order_id", "customer_id0") if not outer else ("order_id",)))
    orders: dict[int, dict] = {}
    customers: dict[int, dict] = {}
    for moment in range(30):
        left = random_changes(run, rng, "o", orders, 12, 3, lambda pk: order(
            pk, rng.choice([None, *range(5)]), rng.randrange(100)), moment, rng.randrange(0, 8), 0.3)
        right = random_changes(run, rng, "c", customers, 5, 2, lambda pk: customer(pk, rng.choice("abcdef")),
                               moment, rng.randrange(0, 4), 0.4)
        run.batch(left, right)
    expected = reference_join(orders, customers, "customer_id", "customer_id", outer, ("customer_id", "name"))
    assert run.rows() == normalized(expected, COLUMNS), f"seed {seed}"
