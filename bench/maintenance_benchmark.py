"""Maintenance benchmark: a table after many small MERGE commits, read before and after maintenance.

Writes `--batches` micro-batches of `--changes` changes each into one Delta table (change
data feed on) through the service's delta-rs engine (`DeltaRsTable.merge`: the MERGE, flags
and application transaction of the ingest sink), in the shape of an insert-heavy CDC stream:
per batch `--update-percent` (default 0) of the changes update or delete (one in four) keys
inserted in the last 20 batches, the rest insert new keys. delta-rs rewrites every file that
holds a matched key together with the batch's inserts into one new file, so updates merge
files by themselves: the small files pile up with inserts. Then runs `TableMaintenance` once (compaction, checkpoint, log cleanup, VACUUM with
`--retention-hours`, 0 by default: no export reads this table) and prints, before and after:
data files referenced, files on disk, log entries, and the time to read the whole table
(a fresh `DeltaTable` to Arrow, best of `--reads`); and checks that the table reads back
identical.

    nice -n 10 .venv/bin/python bench/maintenance_benchmark.py                 # 2,000 x 1,000
    nice -n 10 .venv/bin/python bench/maintenance_benchmark.py --batches 200
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from connectors.delta.delta_rs import DELETE_FLAG, DeltaRsTable
from service.config.settings import settings_from_mapping
from service.operations.maintenance import TableMaintenance

TABLE = "orders"
APP_ID = "maintenance-benchmark"
SCHEMA = pa.schema([("id", pa.int64()), ("customer", pa.string()), ("amount", pa.float64()),
                    ("status", pa.string())])
HOT_BATCHES = 20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=2000, help="micro-batches (MERGE commits)")
    parser.add_argument("--changes", type=int, default=1000, help="changes per micro-batch")
    parser.add_argument("--update-percent", type=int, default=0, help="updates and deletes among the changes")
    parser.add_argument("--retention-hours", type=int, default=0, help="VACUUM retention")
    parser.add_argument("--reads", type=int, default=3, help="full-table reads per measurement (best is shown)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")
    return parser.parse_args(argv)


def batch_changes(rng: random.Random, batch: int, changes: int, update_percent: int, next_id: int,
                  hot: list[int]) -> tuple[pa.Table, int]:
    """One micro-batch of net changes (one row per key): inserts, updates and deletes."""
    inserts = changes - changes * update_percent // 100
    others = rng.sample(hot, min(len(hot), changes - inserts)) if hot else []
    deletes = set(others[: len(others) // 4])
    ids = list(range(next_id, next_id + inserts)) + others
    deleted = [key in deletes for key in ids]
    rows = {
        "id": pa.array(ids, pa.int64()),
        "customer": pa.array([None if d else f"customer-{key % 5000}" for key, d in zip(ids, deleted)], pa.string()),
        "amount": pa.array([None if d else rng.random() * 1000 for d in deleted], pa.float64()),
        "status": pa.array([None if d else f"status-{batch % 7}" for d in deleted], pa.string()),
        DELETE_FLAG: pa.array(deleted, pa.bool_()),
    }
    return pa.table(rows), next_id + inserts


def write_table(table: DeltaRsTable, args: argparse.Namespace) -> float:
    """All micro-batches; returns the seconds they took."""
    rng = random.Random(args.seed)
    table.create(SCHEMA)
    next_id, recent, started = 0, [], time.monotonic()
    for batch in range(args.batches):
        hot = [key for keys in recent for key in keys]
        changes, first_new = batch_changes(rng, batch, args.changes, args.update_percent, next_id, hot)
        table.merge(changes, ("id",), APP_ID, batch)
        recent = (recent + [list(range(next_id, first_new))])[-HOT_BATCHES:]
        next_id = first_new
        if (batch + 1) % 100 == 0:
            print(f"  {batch + 1} batches written ({time.monotonic() - started:.0f}s)", flush=True)
    return time.monotonic() - started


def measure(uri: str, reads: int) -> tuple[dict[str, float], pa.Table]:
    """Files and the best full-table read time of the table at `uri`, and the table read."""
    best, data = float("inf"), None
    for _ in range(reads):
        started = time.monotonic()
        data = DeltaTable(uri).to_pyarrow_table()
        best = min(best, time.monotonic() - started)
    root = Path(uri)
    log_entries = sum(1 for _ in (root / "_delta_log").glob("*.json"))
    on_disk = sum(1 for _ in root.glob("*.parquet"))
    figures = {"data files referenced": len(DeltaTable(uri).file_uris()), "parquet files on disk": on_disk,
               "log entries (json)": log_entries, "rows": data.num_rows, "full read (s)": round(best, 3)}
    return figures, data.sort_by("id")


def main(argv: list[str] | None = None) -> None:
    """Write, measure, maintain, measure again; print the figures."""
    args = parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="maintenance-bench-"))
    settings = settings_from_mapping({
        "lakehouse": {"root": str(workdir)},
        "maintenance": {"vacuum_retention_hours": args.retention_hours},
        "pipelines": [{"name": "bench", "topics": ["orders"], "table": TABLE, "primary_key": ["id"]}],
    })
    uri = settings.lakehouse.table_uri(TABLE)
    print(f"writing {args.batches} micro-batches of {args.changes} changes into {uri}", flush=True)
    write_s = write_table(DeltaRsTable(uri), args)
    print(f"written in {write_s:.1f}s ({write_s / args.batches * 1000:.0f} ms per MERGE)")
    before, data_before = measure(uri, args.reads)
    results = TableMaintenance(settings, settings.pipelines[0]).run()
    after, data_after = measure(uri, args.reads)
    print(f"{'':28}{'before':>12}{'after':>12}")
    for key in before:
        print(f"{key:28}{before[key]:>12}{after[key]:>12}")
    for result in results:
        print(f"maintenance {result.step:12} {result.result:8} {result.seconds:8.2f}s  {result.detail}")
    print(f"table reads back identical: {data_before.equals(data_after)}")


if __name__ == "__main__":
    main()
