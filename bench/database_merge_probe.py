"""Probe: the fixed cost of one table's commit in a steady database micro-batch (issue 24), delta-rs.

Creates `--tables` Delta tables of 250 rows (id, name, amount, updated_at) under `--root`, then
commits `--rounds` rounds of `--rows` changed keys per table, timing per table and commit kind:

- the bookkeeping `MergeSink` does before a MERGE: `last_batch` (the application transaction) and `schema`;
- `merge`: `DeltaRsTable.merge`, the database source's commit (since 2026-11-29 a small commit,
  `connectors/delta/small_commit.py`, where the batch fits, as here);
- `merge, N threads`: the same with 2, 4 and 8 tables at a time (`parallel_merges`);
- `delta-rs MERGE` (and `, 4 threads`): the same batches through delta-rs's MERGE (`small_commits=False`),
  the reference;
- `append` and `overwrite where id in (...)`: what a plain commit of the same rows costs, for scale
  (neither is the MERGE's equal: an append duplicates updated keys, the overwrite loses kept columns);

`--profile FILE` writes a cProfile of one steady single-threaded `merge` round.

Prints ms per table for each, wall and CPU (the process's user + system time, all threads: what
the commit costs the machine whatever the load). Nothing is asserted; the figures go to bench/README.md.

    .venv/bin/python bench/database_merge_probe.py
"""

from __future__ import annotations

import argparse
import cProfile
import os
import random
import resource
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from connectors.delta.delta_rs import _POST_COMMIT, DeltaRsTable
from connectors.delta.merge_plan import DELETE_FLAG


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=40)
    parser.add_argument("--rows", type=int, default=15, help="changed keys per table and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--root", help="where the tables go (default: a temp dir, removed)")
    parser.add_argument("--profile", help="write a cProfile of one single-threaded merge round here")
    args = parser.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="merge-probe-")
    rng = random.Random(24)

    def changes(keys: list[int]) -> pa.Table:
        return pa.table({"id": pa.array(keys, pa.int64()), "name": [f"n{k}-{rng.random()}" for k in keys],
                         "amount": [rng.random() for _ in keys], "updated_at": pa.array([1] * len(keys), pa.int64()),
                         DELETE_FLAG: [False] * len(keys)})

    try:
        tables = [DeltaRsTable(f"{root}/t{i:03d}") for i in range(args.tables)]
        for table in tables:
            table.create_with(changes(list(range(250))), ("id",), "probe", 0)
        batch_id = 0

        def merge(table: DeltaRsTable) -> None:
            table.merge(changes(rng.sample(range(300), args.rows)), ("id",), "probe", batch_id)

        def append(table: DeltaRsTable) -> None:
            write_deltalake(table._open(), changes(rng.sample(range(300), args.rows)).drop_columns([DELETE_FLAG]),
                            mode="append", post_commithook_properties=_POST_COMMIT,
                            commit_properties=CommitProperties(app_transactions=[Transaction("probe", batch_id)]))

        def overwrite(table: DeltaRsTable) -> None:
            data = changes(rng.sample(range(300), args.rows)).drop_columns([DELETE_FLAG])
            where = "id IN (" + ",".join(map(str, data.column("id").to_pylist())) + ")"
            write_deltalake(table._open(), data, mode="overwrite", predicate=where,
                            post_commithook_properties=_POST_COMMIT,
                            commit_properties=CommitProperties(app_transactions=[Transaction("probe", batch_id)]))

        references = {table.uri: DeltaRsTable(table.uri, small_commits=False) for table in tables}

        def reference_merge(table: DeltaRsTable) -> None:
            references[table.uri].merge(changes(rng.sample(range(300), args.rows)), ("id",), "probe", batch_id)

        kinds = [("last_batch", lambda t: t.last_batch("probe"), 1, False), ("schema", DeltaRsTable.schema, 1, False),
                 ("merge", merge, 1, True), ("merge, 2 threads", merge, 2, True), ("merge, 4 threads", merge, 4, True),
                 ("merge, 8 threads", merge, 8, True), ("delta-rs MERGE", reference_merge, 1, True),
                 ("delta-rs MERGE, 4 threads", reference_merge, 4, True), ("append", append, 1, True),
                 ("overwrite where id in (...)", overwrite, 1, True)]
        print(f"{args.tables} tables of 250 rows, {args.rows} keys per commit; load {os.getloadavg()}")
        for name, action, threads, commits in kinds:
            for _ in range(args.rounds):
                batch_id += commits
                started, cpu = time.perf_counter(), _cpu()
                with ThreadPoolExecutor(threads) as pool:
                    list(pool.map(action, tables))
                print(f"{name:30s} {(time.perf_counter() - started) / len(tables) * 1000:7.1f} ms per table, "
                      f"CPU {(_cpu() - cpu) / len(tables) * 1000:6.1f} ms")
        if args.profile:  # a steady round: after one that follows the other kinds' commits
            batch_id += 1
            for table in tables:
                merge(table)
            batch_id += 1
            cProfile.runctx("for table in tables: merge(table)", globals(), locals(), args.profile)
    finally:
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
