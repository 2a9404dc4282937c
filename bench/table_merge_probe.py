"""Probe: one table's steady MERGE as the table grows, the small commit against delta-rs's MERGE.

A table of `--rows` rows shaped like the realistic capture's (an id, a few short columns and a
`--text-bytes` text column standing in for the TOASTed one), then `--rounds` batches of `--batch`
net changes over its keys (updates of random stored keys, a twentieth inserts and a twentieth
deletes), committed by:

- `small commit`: `DeltaRsTable.merge` (`connectors/delta/small_commit.py` where the batch fits);
- `small commit, deletion vectors`: the same on a table with deletion vectors enabled: the changed rows
  are marked deleted in their files, only the batch's rows are written;
- `delta-rs MERGE`: the same batches with `small_commits=False`, the reference.

Each on its own copy of the table; the tables are compared at the end (they must be equal).
Prints ms per commit (median and range over the rounds after the first) and the process's CPU.
Nothing is asserted; the figures go to bench/README.md.

    .venv/bin/python bench/table_merge_probe.py --rows 60000 --batch 9000 --rounds 8
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import string
import tempfile
import time

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder

from connectors.delta.delta_rs import CDF_ENABLED, DeltaRsTable
from connectors.delta.merge_plan import DELETE_FLAG

APP = "probe"
VECTORS = {**CDF_ENABLED, "delta.enableDeletionVectors": "true"}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _texts(rng: random.Random, count: int, size: int) -> list[str]:
    alphabet = string.ascii_letters + string.digits + " "
    block = "".join(rng.choices(alphabet, k=size * 8))
    return [block[(start := rng.randrange(size * 7)):start + size] for _ in range(count)]


def _rows(rng: random.Random, keys: list[int], text_bytes: int, deleted: set[int] = frozenset()) -> pa.Table:
    return pa.table({
        "id": pa.array(keys, pa.int64()),
        "email": [f"u{k}.{rng.randrange(10)}@example.com" for k in keys],
        "revision": pa.array([rng.randrange(100) for _ in keys], pa.int64()),
        "updated_at": pa.array([1_700_000_000_000_000 + rng.randrange(10**9) for _ in keys], pa.int64()),
        "status": [rng.choice(("active", "suspended", "closed")) for _ in keys],
        "notes": _texts(rng, len(keys), text_bytes),
        DELETE_FLAG: [k in deleted for k in keys],
    })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=60_000)
    parser.add_argument("--batch", type=int, default=9_000, help="net changes per commit")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--text-bytes", type=int, default=700)
    parser.add_argument("--root", help="where the tables go (default: a temp dir, removed)")
    args = parser.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="table-merge-probe-")
    rng = random.Random(27)
    try:
        initial = _rows(rng, list(range(args.rows)), args.text_bytes)
        tables = {"small commit": DeltaRsTable(f"{root}/small"),
                  "small commit, deletion vectors": DeltaRsTable(f"{root}/vectors"),
                  "delta-rs MERGE": DeltaRsTable(f"{root}/reference", small_commits=False)}
        for name, table in tables.items():
            table.create_with(initial, ("id",), APP, 0)
            if "vectors" in name:
                DeltaTable(table.uri).alter.set_table_properties(VECTORS)
        live, next_key = set(range(args.rows)), args.rows
        batches = []
        for _ in range(args.rounds):
            fresh = list(range(next_key, next_key + args.batch // 20))
            next_key += len(fresh)
            touched = rng.sample(sorted(live), args.batch - len(fresh))
            gone = set(touched[: args.batch // 20])
            live = (live - gone) | set(fresh)
            batches.append(_rows(rng, touched + fresh, args.text_bytes, gone))
        print(f"{args.rows} rows, batches of {args.batch}, {args.rounds} rounds; load {os.getloadavg()[0]:.2f}")
        for name, table in tables.items():
            times, cpu = [], _cpu()
            for batch_id, batch in enumerate(batches, start=1):
                started = time.perf_counter()
                table.merge(batch, ("id",), APP, batch_id)
                times.append((time.perf_counter() - started) * 1000)
            steady = times[1:] or times
            print(f"{name:30s} median {statistics.median(steady):7.1f} ms per commit "
                  f"({min(steady):.0f}-{max(steady):.0f}), first {times[0]:.0f} ms, "
                  f"CPU {(_cpu() - cpu) / len(times) * 1000:.0f} ms per commit")
        read = [pa.table(QueryBuilder().register("t", DeltaTable(t.uri)).execute("SELECT * FROM t ORDER BY id")
                         .read_all()) for t in tables.values()]
        for name, rows in zip(tables, read):
            if not rows.cast(read[-1].schema).equals(read[-1]):
                raise SystemExit(f"FAILED: {name}'s table differs from the MERGE's")
        print(f"tables equal ({read[-1].num_rows} rows)")
    finally:
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
