"""The export figures of the performance benchmark, in a process of their own.

Runs `export_benchmark.py`'s code path (table build, `ExportPipeline` until idle, records
read back read_committed) against a given broker and prints the figures as one JSON line.
A process of its own so that its Spark JVM ends with it and its RSS is this tree's alone.

    .venv/bin/python bench/perf_export.py --bootstrap 127.0.0.1:9092 --changes 100000
    .venv/bin/python bench/perf_export.py --bootstrap 127.0.0.1:9092 --table realistic --format avro
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
import uuid
from pathlib import Path

from export_benchmark import (
    TABLE,
    RssSampler,
    build_table_apart,
    count_committed,
    delete_topic,
    expected_records,
    parse_args,
    registry,
    run_export,
)

from service.operations.workload import create_topics


def measure(bootstrap: str, changes: int, preset: str = "debezium", table: str = "simple",
            output: str = "json", registry_url: str | None = None) -> dict[str, float]:
    """Build a table of `changes` feed rows, export it, check the records; the figures."""
    topic = f"bench.export.{uuid.uuid4().hex[:12]}"
    options = parse_args(["--changes", str(changes), "--preset", preset, "--bootstrap", bootstrap, "--table", table,
                          "--format", output, *(["--registry", registry_url] if registry_url else [])])
    with tempfile.TemporaryDirectory(prefix="cdc-perf-export-") as tmp:
        workdir = Path(tmp)
        started = time.perf_counter()
        plan = build_table_apart(str(workdir / "tables" / TABLE), changes, shape=table)
        build_s = time.perf_counter() - started
        create_topics(bootstrap, [topic], 1)
        sampler = RssSampler(os.getpid(), None)
        try:
            with registry(options, workdir) as url:
                run = run_export(bootstrap, workdir, topic, options, sampler, url)
            records = count_committed(bootstrap, topic)
        finally:
            sampler.done.set()
            delete_topic(bootstrap, topic)
    want = expected_records(plan, preset)
    if records != want:
        raise SystemExit(f"FAILED: {records:,} records published, the plan implies {want:,}")
    return {"feed_rows": plan["feed_rows"], "records": records, "build_s": build_s, "seconds": run["seconds"],
            "first_batch_s": run["first_batch"], "batches": run["batches"], "rss_mib": sampler.peak}


def main() -> None:
    """Print the figures as one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--table", choices=["simple", "realistic"], default="simple")
    parser.add_argument("--format", choices=["json", "avro"], default="json")
    parser.add_argument("--registry", help="a running registry for --format avro (default: Apicurio started here)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("service.delta_to_kafka.pipeline").setLevel(logging.INFO)
    print(json.dumps(measure(args.bootstrap, args.changes, table=args.table, output=args.format,
                             registry_url=args.registry)))


if __name__ == "__main__":
    main()
