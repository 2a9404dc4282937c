"""Cluster benchmark: `cdc-lakehouse run --until-idle` on a Spark standalone cluster of 1, then 2 workers.

Produces one synthetic Debezium workload to a fresh topic, then for each worker count starts a
standalone cluster on loopback (`testbed.spark_cluster`: pyspark's own Master and Worker classes,
1 core and `--worker-memory` per worker), runs the CLI against it with `spark.master:
spark://...` into a fresh table and checkpoint, checks the table holds exactly the live keys,
stops the cluster and prints events/s per worker count (wall incl. start-up, ingest excl.
start-up, and batches after the first, as `bench/ingest_benchmark.py` measures them).

    nice -n 10 .venv/bin/python bench/cluster_benchmark.py --events 100000 --keys 10000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml
from ingest_benchmark import PIPELINE, TABLE, broker, delete_topic, run_pipeline, verify_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `testbed`

from service.operations.workload import DebeziumWorkload, create_topics, produce  # noqa: E402
from testbed.spark_cluster import StandaloneCluster  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line flags."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000, help="records to produce (about)")
    parser.add_argument("--keys", type=int, default=10_000, help="distinct primary keys")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts to run, in order")
    parser.add_argument("--worker-memory", default="1g", help="memory of each worker (and its executor)")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=25_000)
    parser.add_argument("--bootstrap", help="use this broker instead of starting Apache Kafka for the run")
    return parser.parse_args(argv)


def write_config(workdir: Path, bootstrap: str, topic: str, cluster: StandaloneCluster,
                 args: argparse.Namespace) -> Path:
    """A one-pipeline service config whose Spark master is the cluster."""
    executor_memory = f"{max(256, _mebibytes(args.worker_memory) - 256)}m"  # leaves the worker its overhead
    pipeline = {"name": PIPELINE, "topics": [topic], "table": TABLE, "primary_key": ["id"],
                "max_offsets_per_trigger": args.max_offsets_per_trigger}
    config = {"kafka": {"bootstrap_servers": bootstrap}, "lakehouse": {"root": str(workdir / "tables")},
              "checkpoint_root": str(workdir / "checkpoints"),
              "spark": {"master": cluster.master_url, "shuffle_partitions": args.partitions,
                        "conf": cluster.application_conf(executor_memory)},
              "pipelines": [pipeline]}
    path = workdir / "bench.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _mebibytes(size: str) -> int:
    units = {"m": 1, "g": 1024}
    return int(float(size[:-1]) * units[size[-1].lower()])


def run_on_cluster(workdir: Path, bootstrap: str, topic: str, workers: int, args: argparse.Namespace,
                   workload: DebeziumWorkload) -> dict[str, float]:
    """Start a cluster of `workers`, ingest the topic on it, verify the table; the run's figures."""
    workdir.mkdir()
    started = time.perf_counter()
    with StandaloneCluster(workdir / "cluster", workers=workers, worker_memory=args.worker_memory) as cluster:
        cluster_up = time.perf_counter() - started
        config = write_config(workdir, bootstrap, topic, cluster, args)
        run = run_pipeline(config, workdir / "pipeline.log")
    verify_table(str(workdir / "tables" / TABLE), workload)
    return {**run, "cluster_up": cluster_up}


def report(events: int, runs: dict[int, dict[str, float]], max_offsets: int) -> None:
    """One line per worker count: wall, ingest excl. start-up, steady batches."""
    print(f"{'workers':<8}{'cluster up':>11}{'wall':>9}{'wall ev/s':>11}{'ingest':>9}{'ingest ev/s':>13}"
          f"{'steady ev/s':>13}{'batches':>9}")
    for workers, run in runs.items():
        steady = (events - max_offsets) / run["after_first"] if run["batches"] > 1 and run["after_first"] > 0 else 0
        print(f"{workers:<8}{run['cluster_up']:>10.1f}s{run['wall']:>8.1f}s{events / run['wall']:>11,.0f}"
              f"{run['ingest']:>8.1f}s{events / run['ingest']:>13,.0f}{steady:>13,.0f}{run['batches']:>9.0f}")


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark once per worker count on the same input."""
    args = parse_args(argv)
    topic = f"bench.cluster.{uuid.uuid4().hex[:12]}"
    with tempfile.TemporaryDirectory(prefix="cdc-cluster-bench-") as tmp, broker(args.bootstrap, Path(tmp)) as bootstrap:
        workload = DebeziumWorkload(topic, args.partitions, schema="never", seed=11)
        create_topics(bootstrap, [topic], args.partitions)
        try:
            produced = produce(bootstrap, workload.generate(args.events, args.keys))
            print(f"topic {topic} on {bootstrap}: {produced} records, {len(workload.table)} live keys")
            runs = {}
            for workers in args.workers:
                runs[workers] = run_on_cluster(Path(tmp) / f"workers-{workers}", bootstrap, topic, workers, args,
                                               workload)
                print(f"{workers} worker(s): table verified ({len(workload.table)} rows = live keys)", flush=True)
        finally:
            delete_topic(bootstrap, topic)
    report(produced, runs, args.max_offsets_per_trigger)


if __name__ == "__main__":
    main()
