"""Enrichment join state benchmark: the per-batch cost of the build state (a Delta table in the
checkpoint, delta-rs, no Spark) as it grows.

For each build size: load the rows in one batch, then per micro-batch MERGE `--changes` build
changes and look up the build rows of `--probes` distinct probe keys (as a batch with the gate
open does), and count the expired rows (the TTL check). Prints seconds per step, median of
`--batches` batches, and the machine's load average.

    nice -n 10 .venv/bin/python bench/enrichment_state_benchmark.py
    nice -n 10 .venv/bin/python bench/enrichment_state_benchmark.py --sizes 1000000 --batches 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import pyarrow as pa

from service.kafka_to_delta.joins.enrichment_rows import BUILD_CHANGES_SCHEMA
from service.kafka_to_delta.joins.enrichment_state import BuildState


def _changes(keys: list[int], version: int) -> pa.Table:
    rows = [json.dumps({"id": k, "name": f"customer-{k}-v{version}", "city": f"city-{k % 97}"}) for k in keys]
    return pa.table({"key": [f"[{k}]" for k in keys], "row": rows, "types": [None] * len(keys),
                     "deleted": [False] * len(keys)}, schema=BUILD_CHANGES_SCHEMA)


def _timed(step) -> float:
    started = time.perf_counter()
    step()
    return time.perf_counter() - started


def run(size: int, changes: int, probes: int, batches: int) -> dict[str, float]:
    """Median seconds per step for a build state of `size` keys."""
    with tempfile.TemporaryDirectory() as root:
        state = BuildState(os.path.join(root, "build"), None)
        load = _timed(lambda: state.apply(_changes(list(range(size)), 0), 0, 0))
        merge, lookup, expire = [], [], []
        for batch in range(1, batches + 1):
            changed = list(range(batch, size, max(1, size // changes)))[:changes]
            wanted = [f"[{k}]" for k in range(batch * 7 % size, size, max(1, size // probes))][:probes]
            merge.append(_timed(lambda: state.apply(_changes(changed, batch), batch, batch)))
            lookup.append(_timed(lambda: state.rows(wanted, live_since_ms=0)))
            expire.append(_timed(lambda: state.expire(0, batch)))
        return {"load": load, "merge": statistics.median(merge), "lookup": statistics.median(lookup),
                "expire_check": statistics.median(expire)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--changes", type=int, default=1_000, help="build changes per batch")
    parser.add_argument("--probes", type=int, default=1_000, help="distinct probe keys per batch")
    parser.add_argument("--batches", type=int, default=5)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; {args.changes} build changes and {args.probes} probe keys a batch")
    print(f"{'build keys':>12} {'load s':>8} {'merge s':>8} {'lookup s':>9} {'ttl check s':>12}")
    for size in args.sizes:
        figures = run(size, args.changes, args.probes, args.batches)
        print(f"{size:>12,} {figures['load']:>8.2f} {figures['merge']:>8.3f} {figures['lookup']:>9.3f} "
              f"{figures['expire_check']:>12.3f}")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
