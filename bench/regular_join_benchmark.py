"""The regular join's driver work per micro-batch, without Spark or Kafka: `join_step` (reduce, expire,
join the affected keys before and after, materializer rules) and the state commit (delta-rs MERGE into
the state table), over orders joined with customers.

    nice -n 10 ../.venv/bin/python regular_join_benchmark.py --orders 100000 --customers 10000 --batch 10000

Prints the changes per second of the rules alone and with the state commit, for a state that grows
to `--orders` + `--customers` rows (inserts first, then updates of random orders and customers).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time

import pyarrow as pa

from service.kafka_to_delta.joins.join_state import JoinStateStore, state_uri
from service.kafka_to_delta.joins.regular_join_rules import (
    JoinRules,
    JoinState,
    SideRules,
    join_step,
    side_changes,
)
from service.kafka_to_delta.materialize.rules import MaterializerConfig
from service.kafka_to_delta.rows.arrow import CHANGELOG_SCHEMA
from service.kafka_to_delta.rows.names import Column

RULES = JoinRules(SideRules(("order_id",), ("customer_id",)), SideRules(("customer_id",), ("customer_id",)),
                  outer=True, output=MaterializerConfig("orders_enriched", ("order_id",), "error"))
_COLUMNS = (Column.TOPIC, Column.PARTITION, Column.OFFSET, Column.CHANGE_INDEX, Column.TIMESTAMP, Column.KIND,
            Column.KEY, Column.ROW, Column.TYPES, Column.EVENT_TIME, Column.UNCHANGED)
_SCHEMA = pa.schema([CHANGELOG_SCHEMA.field(c) for c in _COLUMNS])


def _changes(topic: str, rows: list[dict], key: str, offset: int, kind: str) -> pa.Table:
    n = len(rows)
    return pa.table({
        Column.TOPIC: [topic] * n, Column.PARTITION: pa.array([0] * n, pa.int32()),
        Column.OFFSET: list(range(offset, offset + n)), Column.CHANGE_INDEX: pa.array([0] * n, pa.int32()),
        Column.TIMESTAMP: [offset] * n, Column.KIND: [kind] * n, Column.KEY: [f"[{r[key]}]" for r in rows],
        Column.ROW: [json.dumps(r) for r in rows], Column.TYPES: pa.nulls(n, pa.string()),
        Column.EVENT_TIME: pa.nulls(n, pa.int64()), Column.UNCHANGED: pa.nulls(n, pa.string()),
    }, schema=_SCHEMA)


def _batches(args: argparse.Namespace, rng: random.Random):
    """(left changes, right changes) per batch: inserts of every key, then `--updates` random updates."""
    customers = [{"customer_id": c, "name": f"c{c}", "tier": c % 3} for c in range(args.customers)]
    orders = [{"order_id": o, "customer_id": rng.randrange(args.customers), "amount": o % 997}
              for o in range(args.orders)]
    yield [], customers
    for start in range(0, len(orders), args.batch):
        yield orders[start:start + args.batch], []
    for _ in range(args.updates // args.batch):
        left = [{**orders[rng.randrange(args.orders)], "amount": rng.randrange(1000)} for _ in range(args.batch * 9 // 10)]
        right = [{**customers[rng.randrange(args.customers)], "name": f"n{rng.randrange(10**6)}"}
                 for _ in range(args.batch // 10)]
        yield left, right


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=100_000)
    parser.add_argument("--customers", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--updates", type=int, default=50_000)
    args = parser.parse_args()
    print(f"load: {os.getloadavg()[0]:.2f}")
    rng, state, offset = random.Random(1), JoinState(), 0
    rules_s = commit_s = 0.0
    changes = outputs = 0
    with tempfile.TemporaryDirectory() as root:
        store = JoinStateStore(state_uri(root))
        for batch_id, (left, right) in enumerate(_batches(args, rng)):
            lt = _changes("orders", left, "order_id", offset, "+U")
            rt = _changes("customers", right, "customer_id", offset, "+U")
            offset += len(left) + len(right)
            started = time.perf_counter()
            step = join_step(state, side_changes(lt, RULES.left), side_changes(rt, RULES.right), RULES)
            ruled = time.perf_counter()
            store.commit(step, "bench", batch_id)
            commit_s += time.perf_counter() - ruled
            rules_s += ruled - started
            state, changes, outputs = step.state, changes + len(left) + len(right), outputs + step.output.num_rows
    print(f"changes {changes:,}, output net changes {outputs:,}, state rows {state.left.num_rows + state.right.num_rows:,}")
    print(f"rules: {changes / rules_s:,.0f} changes/s ({rules_s:.1f} s); with the state commit: "
          f"{changes / (rules_s + commit_s):,.0f} changes/s (commit {commit_s:.1f} s)")


if __name__ == "__main__":
    main()
