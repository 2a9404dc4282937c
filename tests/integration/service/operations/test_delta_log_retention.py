"""The service's own Delta commits never delete old log entries (an export may still need them;
table maintenance deletes them after checking the exports): delta-rs's post-commit cleanup is off."""

from __future__ import annotations

import os
import time

import pyarrow as pa
from deltalake import DeltaTable

from connectors.delta.delta_rs import DELETE_FLAG, DeltaRsTable

_DAY_S = 86_400


def _changes(first: int) -> pa.Table:
    return pa.table({"id": pa.array([first, first + 1], pa.int64()), "v": pa.array(["a", "b"]),
                     DELETE_FLAG: pa.array([False, False])})


def test_merges_write_checkpoints_but_keep_log_entries_older_than_the_retention(tmp_path):
    table = DeltaRsTable(str(tmp_path / "t"))
    table.create(_changes(0).drop_columns([DELETE_FLAG]).schema)
    DeltaTable(str(tmp_path / "t")).alter.set_table_properties(
        {"delta.logRetentionDuration": "interval 1 second", "delta.checkpointInterval": "2"})
    log_dir = tmp_path / "t" / "_delta_log"
    aged = time.time() - 2 * _DAY_S
    for batch in range(6):
        for entry in log_dir.glob("*.json"):  # every entry so far is older than the retention
            os.utime(entry, (aged, aged))
        table.merge(_changes(10 * batch), ("id",), "app", batch)
    assert sorted(p.name for p in log_dir.glob("*.checkpoint.parquet")), "delta-rs wrote no checkpoint"
    assert (log_dir / "00000000000000000000.json").exists()
    assert len(list(log_dir.glob("*.json"))) == 8  # create, alter, 6 merges
