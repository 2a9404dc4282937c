"""The history's per-batch recomputation in Arrow, on the driver: events of one micro-batch plus the stored
history of the touched keys -> their versions -> the rows to MERGE. No Kafka, no Delta: the cost the
history adds to a batch besides reading the touched keys and the MERGE.

    nice -n 10 ../.venv/bin/python history_benchmark.py --events 200000 --keys 50000 --stored 100000
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow as pa

from connectors.delta.merge_plan import DELETE_FLAG
from service.config.history import START_AT
from service.kafka_to_delta.sink.history_versions import (
    IS_DELETE,
    ORDER,
    changed_rows,
    recompute,
    stored_events,
)


def _events(rng: np.random.Generator, n: int, keys: int, first_sequence: int) -> pa.Table:
    return pa.table({
        "id": rng.integers(0, keys, n), "a": pa.array(rng.integers(0, 4, n).astype(str)),
        "b": rng.integers(0, 1000, n), START_AT: first_sequence + rng.permutation(n),
        IS_DELETE: rng.random(n) < 0.05, ORDER: np.arange(1, n + 1)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000, help="changes in the batch")
    parser.add_argument("--keys", type=int, default=50_000, help="distinct keys they touch (at most)")
    parser.add_argument("--stored", type=int, default=100_000, help="earlier changes behind the stored history")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    stored = recompute(_events(rng, args.stored, args.keys, 0), ("id",), ("a",), False)
    batch = _events(rng, args.events, args.keys, args.stored // 2)  # half of it older than the newest stored
    timings = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        events = pa.concat_tables([stored_events(stored, ("id",)).select(batch.column_names).cast(batch.schema),
                                   batch])
        new = recompute(events, ("id",), ("a",), False)
        changes = changed_rows(new, stored, ("id",), DELETE_FLAG)
        timings.append(time.perf_counter() - started)
    best = min(timings)
    print(f"| batch events | stored rows | history rows | rows to MERGE | best of {args.repeat} | events/s |")
    print("|---|---|---|---|---|---|")
    print(f"| {args.events:,} | {stored.num_rows:,} | {new.num_rows:,} | {changes.num_rows:,} | {best:.2f} s "
          f"| {args.events / best:,.0f} |")


if __name__ == "__main__":
    main()
