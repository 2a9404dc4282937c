"""Ingest benchmark: `cdc-lakehouse run --until-idle` against a plain confluent-kafka consumer.

Produces a synthetic Debezium workload to a fresh topic, times the CLI end to end as a
subprocess, checks the Delta table holds exactly the live keys, times a plain consumer
reading the same topic, prints the figures, then deletes the topic.

"Excluding startup" is measured from the CLI's own log line timestamps (no extra run):
from `service.supervisor.runner`'s `kafka: ...` line, logged just after the SparkSession is built,
to the last `batch N -> ...` line, logged after that batch's Delta commit. It leaves out
JVM/Spark startup before and query/JVM shutdown after.

    .venv/bin/python bench/ingest_benchmark.py --events 20000 --keys 2000
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Iterator

import yaml
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from connectors.kafka.apache_broker import ApacheKafkaBroker
from cpu_samples import CpuSamples
from service.operations.workload import DebeziumWorkload, create_topics, produce

TABLE = "bench_customers"
PIPELINE = "bench"
_CONSUME_BATCH = 10_000
_CONSUME_STALL_S = 30.0
# The embedded broker may answer a fetch with more than librdkafka's 100 MB default.
MAX_RESPONSE_BYTES = 1 << 30
_SAMPLE_S = 0.1  # CPU and RSS of the service's process tree
_LOG_TIME_FORMAT = "%Y-%m-%d %H:%M:%S,%f"
_LOG_TIME = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO "
_READY_LINE = re.compile(_LOG_TIME + r"[\w.]*runner: kafka: ", re.M)  # the runner's module path may move
# A batch's line, logged after its commit; the commit's seconds where the line gives them.
_BATCH_LINE = re.compile(_LOG_TIME + rf"service\.kafka_to_delta\.pipeline: pipeline {PIPELINE}: batch \d+ -> "
                         r"(?:.*merge ([\d.]+)s\)$)?", re.M)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line flags."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000, help="records to produce (about)")
    parser.add_argument("--keys", type=int, default=20_000, help="distinct primary keys")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--bootstrap", help="use this broker instead of starting Apache Kafka for the run")
    parser.add_argument("--schema", choices=["always", "never"], default="never",
                        help="envelopes with a JSON schema part?")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None)
    return parser.parse_args(argv)


@contextmanager
def broker(bootstrap: str | None, workdir: Path) -> Iterator[str]:
    """The given bootstrap servers, or Apache Kafka started (and stopped) for the run."""
    if bootstrap:
        yield bootstrap
        return
    with ApacheKafkaBroker(workdir / "broker") as local:
        yield local.bootstrap_servers


def write_config(workdir: Path, bootstrap: str, topic: str, max_offsets: int | None) -> Path:
    """A one-pipeline service config for the CLI."""
    pipeline = {"name": PIPELINE, "topics": [topic], "table": TABLE, "primary_key": ["id"]}
    if max_offsets:
        pipeline["max_offsets_per_trigger"] = max_offsets
    config = {"kafka": {"bootstrap_servers": bootstrap}, "lakehouse": {"root": str(workdir / "tables")},
              "checkpoint_root": str(workdir / "checkpoints"), "spark": {"master": "local[*]"},
              "pipelines": [pipeline]}
    path = workdir / "bench.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _log_time(text: str) -> float:
    return datetime.strptime(text, _LOG_TIME_FORMAT).timestamp()


def run_pipeline(config: Path, log_path: Path) -> dict[str, float]:
    """Run `cdc-lakehouse run CONFIG --until-idle`; wall, startup, ingest, shutdown seconds, peak RSS, and the
    cores busy in the steady window (`after_first`): the machine's and the service's process tree's."""
    cli = str(Path(sys.executable).with_name("cdc-lakehouse"))
    with open(log_path, "w") as log:
        started = time.time()
        process = subprocess.Popen([cli, "run", str(config), "--until-idle"], stdout=log, stderr=subprocess.STDOUT)
        samples = CpuSamples(process.pid)
        while process.poll() is None:
            samples.take(time.time())
            time.sleep(_SAMPLE_S)
        ended = time.time()
    text = log_path.read_text()
    if process.returncode != 0:
        raise SystemExit(f"FAILED: cdc-lakehouse exited {process.returncode}; end of its log:\n{text[-3000:]}")
    figures = log_figures(text, started, ended)
    last_commit_at = started + figures["startup"] + figures["ingest"]
    return {"wall": ended - started, "rss_mib": samples.peak_rss_mib, **figures,
            "steady_cores": samples.cores(last_commit_at - figures["after_first"], last_commit_at)}


def log_figures(text: str, started: float, ended: float) -> dict[str, float]:
    """Startup, ingest and shutdown seconds from a run's log; `after_first`: from the end of the first batch's
    job to the last batch's line, the time batches 2..N took, whole. The end of the first job is the start
    of its commit (its line's time less the commit's seconds): the next batch's job may run during that
    commit, so the first line's own time would shorten the window by as much as the first commit is long."""
    ready, batches = _READY_LINE.search(text), _BATCH_LINE.findall(text)
    if not ready or not batches:
        raise SystemExit(f"FAILED: 'kafka:' or 'batch N ->' log lines missing; end of log:\n{text[-3000:]}")
    ready_at, first_commit_at, last_commit_at = (_log_time(t) for t in (ready.group(1), batches[0][0],
                                                                        batches[-1][0]))
    first_merge = float(batches[0][1] or 0)
    return {"startup": ready_at - started, "ingest": last_commit_at - ready_at, "shutdown": ended - last_commit_at,
            "batches": len(batches), "first_merge": first_merge,
            "after_first": last_commit_at - (first_commit_at - first_merge)}


def verify_table(uri: str, workload: DebeziumWorkload) -> int:
    """Fail loudly unless the Delta table holds exactly the workload's live keys."""
    table = DeltaTable(uri).to_pyarrow_table()
    ids = set(table.column("id").to_pylist())
    if table.num_rows != len(workload.table) or ids != set(workload.table):
        raise SystemExit(f"FAILED: {uri} has {table.num_rows} rows ({len(ids)} ids), "
                         f"expected {len(workload.table)} live keys")
    return table.num_rows


def consume_all(bootstrap: str, topic: str, partitions: int) -> tuple[int, float]:
    """Read the topic from offset 0 to the high watermarks in batches; (messages, seconds)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.partition.eof": False,
                         "receive.message.max.bytes": MAX_RESPONSE_BYTES})
    try:
        targets = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                   for p in range(partitions)}
        pending = {p for p, high in targets.items() if high > 0}
        count = touched = 0
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        last_progress = started
        while pending:
            messages = consumer.consume(_CONSUME_BATCH, timeout=1.0)
            last_progress = time.perf_counter() if messages else last_progress
            if time.perf_counter() - last_progress > _CONSUME_STALL_S:
                raise SystemExit(f"FAILED: plain consumer stalled before the high watermarks {targets}")
            for message in messages:
                if message.error():
                    raise SystemExit(f"FAILED: consumer error {message.error()}")
                value = message.value()
                touched += len(value) if value else 0
                count += 1
                if message.offset() + 1 >= targets[message.partition()]:
                    pending.discard(message.partition())
        return count, time.perf_counter() - started
    finally:
        consumer.close()


def delete_topic(bootstrap: str, topic: str) -> None:
    """Delete the benchmark topic (its data need not outlive the run)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 5})  # no notice about purged events
    for future in admin.delete_topics([topic], operation_timeout=30).values():
        future.result()


def report(events: int, produce_s: float, run: dict[str, float], consumed: int, consume_s: float,
           max_offsets: int | None = None) -> None:
    """Print the figures as a small table."""
    end_to_end, ingest_only, plain = events / run["wall"], events / run["ingest"], consumed / consume_s
    rows = [
        ("events produced", f"{events}", f"{produce_s:.2f} s produce, {events / produce_s:,.0f} ev/s"),
        ("pipeline, end to end", f"{run['wall']:.2f} s", f"{end_to_end:,.0f} ev/s"),
        ("  Spark startup", f"{run['startup']:.2f} s", "launch -> SparkSession ready"),
        ("  ingest (excl. startup)", f"{run['ingest']:.2f} s",
         f"{ingest_only:,.0f} ev/s, {run['batches']} batch(es)"),
        ("  shutdown", f"{run['shutdown']:.2f} s", "last Delta commit -> exit"),
        *_steady_state_row(events, run, max_offsets),
        ("plain consumer", f"{consume_s:.2f} s", f"{plain:,.0f} ev/s ({consumed} messages)"),
        ("ratio pipeline/consumer", f"{end_to_end / plain:.4f}", f"excl. startup {ingest_only / plain:.4f}"),
        ("pipeline peak RSS", f"{run['rss_mib']:,.0f} MiB", "sum over the process tree, sampled every 0.1 s"),
    ]
    for name, figure, note in rows:
        print(f"{name:<26}{figure:>14}   {note}")


def _steady_state_row(events: int, run: dict[str, float], max_offsets: int | None) -> list[tuple[str, str, str]]:
    """Batches after the first (warm workers) with admission control: events in them / their time."""
    if not max_offsets or run["batches"] < 2 or run["after_first"] <= 0:
        return []
    warm_events = events - max_offsets
    return [("  steady state", f"{run['after_first']:.2f} s",
             f"{warm_events / run['after_first']:,.0f} ev/s over batches 2..{run['batches']}")]


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark once."""
    args = parse_args(argv)
    topic = f"bench.ingest.{uuid.uuid4().hex[:12]}"
    with tempfile.TemporaryDirectory(prefix="cdc-bench-") as tmp, broker(args.bootstrap, Path(tmp)) as bootstrap:
        workdir = Path(tmp)
        workload = DebeziumWorkload(topic, args.partitions, schema=args.schema, seed=11)
        events = workload.generate(args.events, args.keys)
        create_topics(bootstrap, [topic], args.partitions)
        try:
            started = time.perf_counter()
            produced = produce(bootstrap, events)
            produce_s = time.perf_counter() - started
            del events
            print(f"topic {topic} on {bootstrap}: {produced} records, {len(workload.table)} live keys")
            config = write_config(workdir, bootstrap, topic, args.max_offsets_per_trigger)
            run = run_pipeline(config, workdir / "pipeline.log")
            rows = verify_table(str(workdir / "tables" / TABLE), workload)
            print(f"Delta table verified: {rows} rows = live keys")
            consumed, consume_s = consume_all(bootstrap, topic, args.partitions)
            if consumed != produced:
                raise SystemExit(f"FAILED: plain consumer read {consumed} of {produced} records")
        finally:
            delete_topic(bootstrap, topic)
    report(produced, produce_s, run, consumed, consume_s, args.max_offsets_per_trigger)


if __name__ == "__main__":
    main()
