"""Where each micro-batch of a streaming query spends its wall time, from a Spark event log.

Run the service with Spark's event log on (its config's `spark: {conf: {spark.eventLog.enabled: "true",
spark.eventLog.dir: DIR}}`), then point this at DIR (or at one application's log in it). Printed per
micro-batch: Spark's own phases (`durationMs` of each query progress: planning, the write-ahead and
commit logs, `addBatch`) and, inside `addBatch`, the wall time of the batch's Spark stages, from the
first stage's submission to the last one's completion; the rest of `addBatch` is the driver's own work
(the sink's MERGE, collecting the payloads). Then the medians over the steady batches (all but the
first `--skip` and the last, which is usually a partial one).

    .venv/bin/python bench/trigger_breakdown.py /tmp/eventlog [--skip 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
from datetime import datetime
from pathlib import Path
from typing import Iterator

import pyarrow as pa

PHASES = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets", "triggerExecution")


def events(path: Path) -> Iterator[dict]:
    """The events of one application's log (plain or zstd-compressed; a directory: its newest log)."""
    if path.is_dir():
        logs = sorted((p for p in path.rglob("*") if p.is_file() and not p.name.startswith("appstatus")),
                      key=lambda p: p.stat().st_mtime)
        if not logs:
            raise SystemExit(f"no event log under {path}")
        path = logs[-1]
    # Spark compresses its event logs with zstd by default (the file name says so); Arrow reads them.
    compression = "zstd" if path.suffix == ".zstd" else None
    with pa.input_stream(str(path), compression=compression) as stream:
        text = stream.read().decode()
    for line in text.splitlines():
        if line.strip():
            yield json.loads(line)


def breakdown(log: Iterator[dict]) -> list[dict]:
    """One row per micro-batch: its phases (ms) and the wall time of its Spark stages (ms)."""
    stages: dict[int, tuple[float, float]] = {}
    progress = []
    for event in log:
        kind = event["Event"]
        if kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            if info.get("Submission Time") and info.get("Completion Time"):
                stages[info["Stage ID"]] = (info["Submission Time"], info["Completion Time"])
        elif kind.endswith("QueryProgressEvent"):
            progress.append(event["progress"])
    rows = []
    for item in progress:
        began = datetime.fromisoformat(item["timestamp"].replace("Z", "+00:00")).timestamp() * 1000
        durations = item.get("durationMs") or {}
        ended = began + durations.get("triggerExecution", 0)
        inside = [(start, end) for start, end in stages.values() if began <= start and end <= ended]
        row = {phase: durations.get(phase, 0) for phase in PHASES}
        row["batch"] = item["batchId"]
        row["stages"] = (max(e for _, e in inside) - min(s for s, _ in inside)) if inside else 0
        row["driver"] = row["addBatch"] - row["stages"]
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="an event log directory or file")
    parser.add_argument("--skip", type=int, default=2, help="first micro-batches left out of the medians")
    args = parser.parse_args()
    rows = breakdown(events(args.log))
    columns = ("batch", "triggerExecution", "latestOffset", "queryPlanning", "walCommit", "addBatch", "stages",
               "driver", "commitOffsets")
    print(" ".join(f"{c:>16}" for c in columns))
    for row in rows:
        print(" ".join(f"{row[c]:>16,.0f}" for c in columns))
    steady = rows[args.skip:-1] if len(rows) > args.skip + 1 else rows[args.skip:]
    if steady:
        print(" ".join([f"{'median':>16}"] + [f"{statistics.median(r[c] for r in steady):>16,.0f}"
                                              for c in columns[1:]]))


if __name__ == "__main__":
    main()
