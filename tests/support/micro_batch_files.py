"""Parquet files a streaming file source reads one per micro-batch, in the order written.

Spark's file source orders files by modification time, and files written within one clock tick
share it (then the directory listing decides), so each file gets its own time from its index."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

FIRST_MTIME_S = 1_700_000_000


def write_micro_batch_file(directory: Path, index: int, table: pa.Table) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{index:04d}.parquet"
    pq.write_table(table, path)
    os.utime(path, (FIRST_MTIME_S + index, FIRST_MTIME_S + index))
    return path
