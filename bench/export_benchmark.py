"""Export benchmark: a Delta table's change feed -> TO_CHANGELOG -> Kafka, exactly once.

Builds a Delta table with `--changes` change-feed rows in a few large commits (delta-rs
directly: 40 % inserts in the first commit, then three MERGE commits of updates and
deletes), exports it once with `ExportPipeline` until idle, at most one version and
`--max-rows` feed rows per micro-batch, a larger version split between keys (the service's
export path: change feed source, TO_CHANGELOG with per-flush compaction, the record layout,
one Kafka transaction per micro-batch), checks that a
read_committed consumer sees exactly the records the plan implies, and prints the figures.
The output topic is deleted at the end (the embedded broker keeps everything in memory).

Figures: feed rows and records; export seconds from query start to its end (Spark is
already up) and from the first to the last committed batch; feed rows per second; peak
RSS of this process tree (driver, JVM, Python workers; the broker and a registry started for the run apart).

    .venv/bin/python bench/export_benchmark.py --changes 100000
    .venv/bin/python bench/export_benchmark.py                      # 1,000,000 feed rows
    .venv/bin/python bench/export_benchmark.py --table realistic --format avro

`--table realistic` exports the Delta types of a real Debezium capture (`export_tables.py`);
`--format avro` writes Confluent Avro (`avro-confluent`) through a real registry: `--registry
URL`, else an Apicurio started for the run (the registry the tests use).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `tests` (the registry)

# First, as the service's own entry point does: importing the package sets the native allocators'
# defaults (service/runtime/allocators.py), which count only if set before pyarrow and deltalake load.
import service  # noqa: F401, E402

# isort: split
import argparse
import logging
import multiprocessing
import os
import random
import re
import tempfile
import threading
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack, contextmanager
from typing import Iterator

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable, write_deltalake
from cpu_samples import proc_stats, process_tree
from export_tables import SHAPES

from connectors.kafka.apache_broker import ApacheKafkaBroker
from service.config.exports import DEFAULT_MAX_ROWS_PER_TRIGGER
from service.config.settings import SparkSettings, settings_from_mapping
from service.delta_to_kafka.exports import export_pipeline
from service.kafka_to_delta.plan.compiled_plan import compile_plan
from service.operations.workload import create_topics
from service.runtime.jvm_profiles import jvm_profile
from service.runtime.planner_workers import stop_idle_planner_workers
from service.runtime.spark_session import build_spark

TABLE = "bench_export"
UPDATE_COMMITS = 3
INSERT_SHARE = 0.4
_RSS_SAMPLE_S = 0.5
_CONSUME_BATCH = 10_000
_CONSUME_POLL_S = 1.0
_CONSUME_WAIT_S = 300  # the first fetch of a large topic from the embedded broker, on a loaded machine
_MAX_RESPONSE_BYTES = 2**31 - 1  # librdkafka's limit: noida-db answers one fetch with a whole 1.2 GB topic


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line flags."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=1_000_000, help="change-feed rows in the table")
    parser.add_argument("--preset", choices=["debezium", "flat"], default="debezium")
    parser.add_argument("--table", choices=sorted(SHAPES), default="simple", help="the table's shape")
    parser.add_argument("--format", choices=["json", "avro"], default="json",
                        help="json: the preset's JSON layout; avro: avro-confluent through a registry")
    parser.add_argument("--input-changelog", choices=["retract", "upsert"], default="retract",
                        help="upsert: the export keeps every key's last image in state (a stateful flush)")
    parser.add_argument("--registry", help="a running Confluent-compatible registry for --format avro "
                                           "(default: Apicurio started for the run)")
    parser.add_argument("--bootstrap", help="use this broker instead of starting Apache Kafka for the run")
    parser.add_argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS_PER_TRIGGER,
                        help="the export's max_rows_per_trigger (feed rows per micro-batch)")
    return parser.parse_args(argv)


@contextmanager
def broker(bootstrap: str | None, workdir: Path) -> Iterator[tuple[str, int | None]]:
    """(bootstrap servers, broker pid or None): the given broker, or Apache Kafka started for the run."""
    if bootstrap:
        yield bootstrap, None
        return
    with ApacheKafkaBroker(workdir / "broker") as local:
        yield local.bootstrap_servers, local.pid


def _child_named(parent: int, command: str) -> int | None:
    """The pid of a child process of `parent` running `command` (from /proc)."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:
            continue
        if int(fields["PPid"]) == parent and fields["Name"].strip() == command:
            return int(status.parent.name)
    return None


@contextmanager
def registry(args: argparse.Namespace, workdir: Path) -> Iterator[str | None]:
    """The schema registry's URL for an Avro run (None for JSON)."""
    if args.format != "avro" or args.registry:
        yield args.registry
        return
    from tests.support.registry.apicurio import ApicurioRegistry

    with ApicurioRegistry(workdir / "apicurio") as started:
        yield started.url


def build_table(uri: str, changes: int, seed: int = 5, shape: str = "simple") -> dict[str, int]:
    """The table and its plan: {'inserts', 'updates', 'deletes', 'feed_rows', 'versions'}."""
    schema, _rows = SHAPES[shape]
    rng = random.Random(seed)
    inserts = int(changes * INSERT_SHARE)
    per_commit = (changes - inserts) // UPDATE_COMMITS  # feed rows: 2 per update, 1 per delete
    deletes = per_commit // 5
    updates = (per_commit - deletes) // 2
    write_deltalake(uri, _rows(list(range(inserts)), 1), configuration={"delta.enableChangeDataFeed": "true"})
    live = list(range(inserts))
    for version in range(2, UPDATE_COMMITS + 2):
        picked = rng.sample(live, updates + deletes)
        gone = set(picked[updates:])
        source = _rows(picked, version).append_column("deleted", pa.array([i in gone for i in picked]))
        (DeltaTable(uri).merge(source, "t.id = s.id", source_alias="s", target_alias="t")
         .when_matched_delete(predicate="s.deleted")
         .when_matched_update(updates={c: f"s.{c}" for c in schema.names if c != "id"}, predicate="NOT s.deleted")
         .execute())
        live = [i for i in live if i not in gone]
    total_updates, total_deletes = updates * UPDATE_COMMITS, deletes * UPDATE_COMMITS
    return {"inserts": inserts, "updates": total_updates, "deletes": total_deletes,
            "feed_rows": inserts + 2 * total_updates + total_deletes, "versions": UPDATE_COMMITS + 1}


def build_table_apart(uri: str, changes: int, shape: str = "simple") -> dict[str, int]:
    """`build_table` in a process of its own: the memory the build leaves allocated (Arrow's and
    delta-rs's pools keep what they freed) is not counted in the export's peak RSS."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as apart:
        return apart.submit(build_table, uri, changes, 5, shape).result()


def expected_records(plan: dict[str, int], preset: str) -> int:
    """Records one export publishes when no flush holds more than one version: one per change,
    an update's pre- and post-image as one; the Debezium preset adds a tombstone per delete."""
    tombstones = plan["deletes"] if preset == "debezium" else 0
    return plan["inserts"] + plan["updates"] + plan["deletes"] + tombstones


def _process_name(pid: int) -> str:
    """A short name: the Python module a Python process runs (`-m`), else the program's name."""
    try:
        words = [w.decode(errors="replace") for w in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if w]
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"
    if "-m" in words and words.index("-m") + 1 < len(words):
        return words[words.index("-m") + 1]
    return name


class RssSampler(threading.Thread):
    """Peak RSS and CPU seconds of this process tree and, apart, peak RSS of the broker, sampled in the background.

    CPU is what the tree's processes used since `start` (a process that ends counts up to its last sample),
    less this sampler's own (a thread of this process: a scan of /proc costs a few milliseconds)."""

    def __init__(self, root: int, broker_pid: int | None, apart: int | None = None) -> None:
        super().__init__(daemon=True)
        self.root, self.broker_pid = root, broker_pid
        self._apart = {pid for pid in (broker_pid, apart) if pid}  # the broker, a registry started for the run
        self.peak = self.broker_peak = 0.0
        self.peaks: dict[str, float] = {}  # "pid name" -> its own RSS when the tree's sum peaked
        self.done = threading.Event()
        self._cpu_start: dict[int, float] = {}
        self._cpu_last: dict[int, float] = {}
        self._names: dict[int, str] = {}
        self._own_cpu_s = 0.0

    @property
    def cpu_s(self) -> float:
        return sum(self.cpu_by_process.values())

    @property
    def cpu_by_process(self) -> dict[str, float]:
        """CPU seconds since `start` by "pid name" (the sampler's own left out)."""
        return {f"{pid} {self._names.get(pid, '?')}":
                seconds - self._cpu_start.get(pid, 0.0) - (self._own_cpu_s if pid == self.root else 0.0)
                for pid, seconds in self._cpu_last.items()}

    def _sample(self) -> None:
        stats = proc_stats()
        tree = process_tree(self.root, stats, self._apart)
        for pid in tree - set(self._names):
            self._names[pid] = _process_name(pid)
        by_process = {f"{pid} {self._names[pid]}": stats[pid][2] for pid in tree}
        if sum(by_process.values()) > self.peak:
            self.peak, self.peaks = sum(by_process.values()), by_process
        if self.broker_pid:
            self.broker_peak = max(self.broker_peak, sum(stats[pid][2] for pid in process_tree(self.broker_pid, stats)))
        self._cpu_last.update({pid: stats[pid][1] for pid in tree})

    def run(self) -> None:
        started = time.thread_time()
        stats = proc_stats()
        self._cpu_start = {pid: stats[pid][1] for pid in process_tree(self.root, stats, self._apart)}
        while not self.done.wait(_RSS_SAMPLE_S):
            self._sample()
            self._own_cpu_s = time.thread_time() - started
        self._sample()
        self._own_cpu_s = time.thread_time() - started


class BatchTimes(logging.Handler):
    """Times and feed rows of the export's `batch N -> ...` log lines (logged after each Kafka commit)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.times: list[float] = []
        self.rows: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if " -> " in message and ": batch " in message:
            self.times.append(record.created)
            found = re.search(r"(\d+) feed rows", message)
            self.rows.append(int(found.group(1)) if found else 0)


def count_committed(bootstrap: str, topic: str) -> int:
    """Records a read_committed consumer sees on partition 0 of `topic`."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False,
                         # The embedded broker may answer a fetch with more than the 100 MB default.
                         "receive.message.max.bytes": _MAX_RESPONSE_BYTES})
    consumer.assign([TopicPartition(topic, 0, 0)])
    count = 0
    deadline = time.monotonic() + _CONSUME_WAIT_S
    try:
        while True:
            # A short wait per call: consume() waits for a whole batch, and the end of the
            # partition comes with fewer records than that.
            messages = consumer.consume(_CONSUME_BATCH, timeout=_CONSUME_POLL_S)
            if messages:
                deadline = time.monotonic() + _CONSUME_WAIT_S
            elif time.monotonic() > deadline:
                raise SystemExit(f"FAILED: no end of {topic} within {_CONSUME_WAIT_S} s ({count:,} records read)")
            for message in messages:
                if message.error() is None:
                    count += 1
                elif message.error().code() == KafkaError._PARTITION_EOF:
                    return count
                else:
                    raise SystemExit(f"FAILED: consumer error {message.error()}")
    finally:
        consumer.close()


def run_export(bootstrap: str, workdir: Path, topic: str, args: argparse.Namespace,
               sampler: RssSampler, registry_url: str | None = None) -> dict[str, float]:
    """Export the table until idle; seconds from query start and between first and last batch."""
    name = f"bench-{uuid.uuid4().hex[:8]}"
    export = {"name": name, "table": TABLE, "topic": topic, "primary_key": "id", "preset": args.preset,
              "max_versions_per_trigger": 1, "max_rows_per_trigger": args.max_rows,
              "input_changelog": args.input_changelog}
    if args.format == "avro":
        export.update({"format": "avro-confluent", "schema_registry": {"url": registry_url}})
    settings = settings_from_mapping({
        "kafka": {"bootstrap_servers": bootstrap}, "lakehouse": {"root": str(workdir / "tables")},
        "checkpoint_root": str(workdir / "checkpoints"), "exports": [export],
    })
    # As the service runs an export: the JVM profile its compiled plan picks, and Spark's idle
    # data-source planning processes stopped once the query enters its first micro-batch.
    spark = build_spark(SparkSettings(master="local[*]"), jvm=jvm_profile(compile_plan(settings)))
    batches = BatchTimes()
    logging.getLogger("service.delta_to_kafka.pipeline").addHandler(batches)
    sampler.start()
    pipeline = export_pipeline(spark, settings, settings.exports[0])
    pipeline.on_first_batch = lambda: stop_idle_planner_workers(spark)
    started = time.time()
    query = pipeline.start(until_idle=True)
    try:
        query.awaitTermination()
    finally:
        pipeline.close()
    ended = time.time()
    sampler.done.set()
    sampler.join()
    if query.exception() is not None:
        raise SystemExit(f"FAILED: export query ended with {query.exception()}")
    between = batches.times[-1] - batches.times[0] if len(batches.times) > 1 else 0.0
    return {"seconds": ended - started, "first_batch": batches.times[0] - started, "between": between,
            "first_rows": batches.rows[0],
            "batches": pipeline.committed_batches}


def delete_topic(bootstrap: str, topic: str) -> None:
    """Delete the output topic (the embedded broker keeps all data in memory)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 5})
    for future in admin.delete_topics([topic], operation_timeout=60).values():
        future.result()


def report(plan: dict[str, int], build_s: float, run: dict[str, float], records: int, sampler: RssSampler) -> None:
    """Print the figures."""
    rows = plan["feed_rows"]
    later = rows - run["first_rows"]
    figures = [
        ("table", f"{rows:,} feed rows", f"{plan['versions']} versions, built in {build_s:.1f} s "
                                         f"({plan['inserts']:,} inserts, {plan['updates']:,} updates, "
                                         f"{plan['deletes']:,} deletes)"),
        ("export, until idle", f"{run['seconds']:.1f} s", f"{rows / run['seconds']:,.0f} feed rows/s, "
                                                          f"{records / run['seconds']:,.0f} records/s, "
                                                          f"{run['batches']} batches"),
        ("  to first commit", f"{run['first_batch']:.1f} s",
         f"query start, Python workers, first batch ({run['first_rows']:,} feed rows)"),
        ("  batches 2..N", f"{run['between']:.1f} s", f"{later / run['between']:,.0f} feed rows/s"
                                                      if run["between"] else "-"),
        ("records published", f"{records:,}", "read back read_committed, equal to the plan"),
        ("CPU, export", f"{sampler.cpu_s:.1f} s", f"driver + JVM + Python workers: {rows / sampler.cpu_s:,.0f} "
                                                  "feed rows per CPU second (a figure less bent by load): " +
                                                  ", ".join(f"{name} {seconds:.1f}" for name, seconds in sorted(
                                                      sampler.cpu_by_process.items(), key=lambda item: -item[1])
                                                      if seconds >= 0.1)),
        ("peak RSS", f"{sampler.peak:,.0f} MiB", "driver + JVM + Python workers: " + ", ".join(
            f"{name} {mib:,.0f}" for name, mib in sorted(sampler.peaks.items(), key=lambda item: -item[1]) if mib >= 1)),
    ]
    if sampler.broker_pid:  # a broker given with --bootstrap is not this run's to measure
        figures.append(("broker peak RSS", f"{sampler.broker_peak:,.0f} MiB", "Apache Kafka started for the run"))
    for name, figure, note in figures:
        print(f"{name:<20}{figure:>20}   {note}")


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark once."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("service.delta_to_kafka.pipeline").setLevel(logging.INFO)
    topic = f"bench.export.{uuid.uuid4().hex[:12]}"
    with tempfile.TemporaryDirectory(prefix="cdc-export-bench-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        bootstrap, broker_pid = stack.enter_context(broker(args.bootstrap, workdir))
        registry_url = stack.enter_context(registry(args, workdir))
        started = time.perf_counter()
        plan = build_table_apart(str(workdir / "tables" / TABLE), args.changes, shape=args.table)
        build_s = time.perf_counter() - started
        create_topics(bootstrap, [topic], 1)
        started_registry = None if args.format != "avro" or args.registry else _child_named(os.getpid(), "java")
        sampler = RssSampler(os.getpid(), broker_pid, apart=started_registry)
        try:
            run = run_export(bootstrap, workdir, topic, args, sampler, registry_url)
            print(f"export done: {run['seconds']:.1f} s, CPU {sampler.cpu_s:.1f} s, peak RSS {sampler.peak:,.0f} MiB "
                  f"({', '.join(f'{n} {m:,.0f}' for n, m in sampler.peaks.items() if m >= 1)}; reading the records back)",
                  flush=True)
            records = count_committed(bootstrap, topic)
            want = expected_records(plan, args.preset)
            if records != want:
                raise SystemExit(f"FAILED: {records:,} records published, the plan implies {want:,}")
        finally:
            sampler.done.set()
            delete_topic(bootstrap, topic)
    report(plan, build_s, run, records, sampler)


if __name__ == "__main__":
    main()
