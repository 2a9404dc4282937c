"""Realistic benchmark: the service against the naive pipeline on realistic inputs, one row per input.

Inputs (rows, `--rows`):
- workload-compact / workload-spaced: performance_benchmark's workload (`DebeziumWorkload`, half the
  envelopes with the Connect schema block, 4 partitions), compact JSON and the same records with
  `json.dumps`' usual spaces (", " and ": ");
- capture-{schemas,plain}-p{1,4}: a real Debezium capture (embedded engine, PostgreSQL;
  testbed/realistic_capture.py) of one table with numeric(12,2), timestamptz, date, jsonb, uuid, an
  enum, text[] and a TOASTed text column, `--changes` changes (snapshot and streamed), captured with
  (`schemas`) and without (`plain`) the Connect schema blocks into topics of one partition, then
  copied, keyed as captured (murmur2, as Kafka's Java producer), into topics of four;
- capture-avro-p{1,4}: the same capture as Confluent Avro through a real Apicurio registry. SHORTCUT:
  the Debezium Avro converter (Confluent's AvroConverter) is not on Maven Central, so the captured
  Connect records are converted in Python the way it maps Connect schemas (testbed/connect_avro.py).

Per row (`--sections`):
- floor: the row's topic read whole by the service's own range reader in one process per core, nothing
  decoded (read_floor.py), three runs, the median: no pipeline reading through that reader can be faster
  here, so a row whose floor is below a share of the best row's steady rate cannot reach that share;
- steady: the naive pipeline (`perf_naive.py` for the workload rows, `realistic_naive.py` for the
  captures) and `cdc-lakehouse run --until-idle` with the service defaults on the same topic but for
  `max_offsets_per_trigger`, the row's records over `--steady-batches` (at the default 200,000 a row
  of 300,000 records has one steady batch, and its rate is that one batch's job and commit); events/s
  of the naive pipeline, steady events/s of the service (batches 2..N from the end of the first
  batch's job to the last commit, performance_benchmark's definition), their ratio, the row's service
  rate against the best row's; whether the service's table (and the naive one) equals the replay (workload) or `SELECT *` of the source table (captures,
  values compared after one normalisation of representation, testbed/realistic_capture.py);
  peak RSS of the service's process tree; the cores busy in the steady window, the machine's and the
  service's process tree's, split by its driver, JVM and Python workers (bench/cpu_samples.py, every
  0.1 s; the machine's rest is mostly the broker); the range decode statistics (the `cdc_ranges` counter
  scraped from the service's /metrics every 0.5 s, last value before exit; the fallback reasons
  from its log). `--steady-runs` runs of each (default 3), naive and service in turns, fresh tables: the
  figures are the median run's (each run's rate is listed), and the service's steady rate in MB/s of
  values (the rows' records differ up to tenfold in size);
- materializer: `upsert_materialize: force`, `max_offsets_per_trigger` `--materializer-batch`: steady events/s;
- freshness: the service with a 1 s trigger; the row's records (deletes and tombstones left out: a
  deleted row image cannot tell which delete it came from) replayed into a fresh topic, the first
  `--warm-up-events` before it starts, then `--rate` events/s for `--rate-seconds`; p50/p95 event-to-Delta
  latency (perf_freshness.py: the clock is the revision in each row image's `email`).

`--deletion-vectors`: the steady and materializer runs create their tables with `table_shape:
{deletion_vectors: true}` (MERGEs mark changed rows deleted instead of rewriting files); the naive
pipeline and the freshness runs are unchanged.

    .venv/bin/python bench/realistic_benchmark.py --changes 20000 --rate-seconds 10      # a quick look
    .venv/bin/python bench/realistic_benchmark.py --json /tmp/realistic.json             # the defaults
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import pyarrow as pa
import requests
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from deltalake import DeltaTable
from ingest_benchmark import MAX_RESPONSE_BYTES, TABLE, delete_topic, run_pipeline
from ingest_benchmark import write_config as ingest_config
from materializer_benchmark import write_config as variant_config
from perf_freshness import Service, phase, wait_drained, warm_up
from perf_naive import run_naive
from performance_benchmark import (
    CLI,
    FIRST_COMMIT_TIMEOUT_S,
    attempt,
    check_replay,
    load,
    service_figures,
)
from read_floor import read_floor
from realistic_naive import AvroPayloads, json_payload, run_naive_changes

from connectors.delta.table_scan import scan
from connectors.kafka.apache_broker import ApacheKafkaBroker
from connectors.kafka.local_broker import free_port
from connectors.schema_registry.client import SchemaRegistryClient
from service.config.settings import DEFAULT_MAX_OFFSETS_PER_TRIGGER
from service.operations.workload import DebeziumWorkload, Event, create_topics, produce

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `testbed`, `tests`

from testbed.connect_avro import ConnectAvroConverter  # noqa: E402
from testbed.realistic_capture import CapturedTopics, capture, compare_with_source  # noqa: E402

ROWS = ("workload-compact", "workload-spaced", "capture-schemas-p1", "capture-schemas-p4", "capture-plain-p1",
        "capture-plain-p4", "capture-avro-p1", "capture-avro-p4")
SECTIONS = ("floor", "steady", "materializer", "freshness")
_RANGES = re.compile(r'^cdc_ranges_total\{(?=[^}]*decode="(\w+)")[^}]*\} ([0-9.e+]+)$', re.M)
_RANGES_READ = re.compile(r"pipeline bench: batch \d+ -> .* from (\d+) Kafka range\(s\) \((\d+) in bulk\)")
_STAGES = re.compile(r"pipeline bench: batch (\d+) -> .*\(read\+decode\+reduce ([0-9.]+)s, merge ([0-9.]+)s\)")
_FALLBACK = re.compile(r"pipeline bench: (\d+) Kafka range\(s\) decoded record by record, e\.g\. (.*)$", re.M)
_CLOCK = re.compile(r"\.(\d+)@")
_SCRAPE_S = 0.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line flags."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated inputs out of {','.join(ROWS)}")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"out of {','.join(SECTIONS)}")
    parser.add_argument("--changes", type=int, default=300_000, help="changes of the capture; events of the workload")
    parser.add_argument("--keys", type=int, default=100_000, help="the workload's distinct keys")
    parser.add_argument("--naive-window", type=int, default=50_000, help="records per MERGE of the naive pipeline")
    parser.add_argument("--materializer-batch", type=int, default=10_000, help="max_offsets_per_trigger")
    parser.add_argument("--steady-batches", type=int, default=5,
                        help="steady: the service's batches per row (max_offsets_per_trigger = records / this)")
    parser.add_argument("--steady-runs", type=int, default=3,
                        help="steady: naive and service runs per row, in turns; the median run is shown")
    parser.add_argument("--deletion-vectors", action="store_true",
                        help="the service's tables (steady and materializer) with `table_shape: {deletion_vectors: true}`")
    parser.add_argument("--rate", type=float, default=5_000, help="freshness: steady input events/s")
    parser.add_argument("--rate-seconds", type=float, default=30, help="freshness: seconds of steady input")
    parser.add_argument("--warm-up-events", type=int, default=1_000, help="freshness: the small first input")
    parser.add_argument("--drain-seconds", type=float, default=180, help="freshness: wait for the table at most")
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP"),
                        help="a running broker (default $KAFKA_BOOTSTRAP; else Apache Kafka started for the run)")
    parser.add_argument("--registry", default=os.environ.get("SCHEMA_REGISTRY_URL"),
                        help="a running Confluent-compatible registry (default: Apicurio started here)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON (after each row and section)")
    parser.add_argument("--from-json", metavar="PATH", help="run nothing: print the table of an earlier --json")
    args = parser.parse_args(argv)
    args.row_list = [r.strip() for r in args.rows.split(",") if r.strip()]
    args.section_list = [s.strip() for s in args.sections.split(",") if s.strip()]
    if set(args.row_list) - set(ROWS) or set(args.section_list) - set(SECTIONS):
        parser.error(f"rows out of {ROWS}, sections out of {SECTIONS}")
    return args


# --- the inputs -------------------------------------------------------------------------------

class Input:
    """One row's topic, how to read it and how to check a table built from it."""

    def __init__(self, name: str, topic: str, partitions: int, records: int, fmt: str = "json",
                 workload: DebeziumWorkload | None = None, source_rows: list[dict] | None = None) -> None:
        self.name, self.topic, self.partitions, self.records = name, topic, partitions, records
        self.format, self.workload, self.source_rows = fmt, workload, source_rows
        self.bytes_per_record = 0.0

    def check(self, uri: str) -> str | None:
        """None when the table at `uri` equals the replay / SELECT *; else what differs."""
        if self.workload is not None:
            try:
                check_replay(uri, self.workload)
                return None
            except SystemExit as failure:
                return str(failure)[:300]
        rows = scan(DeltaTable(uri)).read_all().to_pylist()
        return compare_with_source(rows, self.source_rows)

    @staticmethod
    def column_types(uri: str) -> dict[str, str]:
        """The Delta table's Arrow column types."""
        return {field.name: str(field.type) for field in pa.schema(DeltaTable(uri).schema().to_arrow())}


def _consumer(bootstrap: str) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": f"realistic-{uuid.uuid4().hex}",
                     "enable.auto.commit": False, "enable.partition.eof": False,
                     "receive.message.max.bytes": MAX_RESPONSE_BYTES})


def read_topic(bootstrap: str, topic: str, partitions: int, limit: int | None = None):
    """Every record (partition order kept, partitions one after the other) as confluent Messages."""
    consumer = _consumer(bootstrap)
    try:
        for partition in range(partitions):
            end = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
            if limit is not None:
                end = min(end, limit)
            if end == 0:
                continue
            consumer.assign([TopicPartition(topic, partition, 0)])
            done = 0
            while done < end:
                for message in consumer.consume(10_000, timeout=5.0):
                    if message.error():
                        raise SystemExit(f"FAILED: consumer error {message.error()}")
                    done = message.offset() + 1
                    yield message
    finally:
        consumer.close()


def copy_topic(bootstrap: str, source: str, target: str, partitions: int, convert=None) -> tuple[int, int]:
    """Copy a one-partition topic into `target` keyed as captured (murmur2); (records, value bytes)."""
    create_topics(bootstrap, [target], partitions)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True,
                         "partitioner": "murmur2_random", "batch.num.messages": 10_000})
    count = size = 0
    for message in read_topic(bootstrap, source, 1):
        key, value = message.key(), message.value()
        if convert is not None:
            key, value = convert(key, value)
        while True:
            try:
                producer.produce(target, value=value, key=key, headers=message.headers())
                break
            except BufferError:
                producer.poll(0.1)
        count, size = count + 1, size + len(value or b"")
    if producer.flush(120):
        raise SystemExit(f"FAILED: records to {target} not acknowledged")
    return count, size


def workload_inputs(args, bootstrap: str, rows: list[str], topics: list[str]) -> dict[str, Input]:
    """The workload's topics: compact and spaced JSON, 4 partitions each (added to `topics`)."""
    out = {}
    workload = DebeziumWorkload("unused", 4, schema="mixed", seed=11)
    events = workload.generate(args.changes, args.keys)
    for name in rows:
        topic = f"bench.realistic.{name}.{uuid.uuid4().hex[:8]}"
        create_topics(bootstrap, [topic], 4)
        topics.append(topic)
        spaced = name.endswith("spaced")

        def respell(event: Event, topic: str = topic, spaced: bool = spaced) -> Event:
            if not spaced:
                return Event(topic, event.partition, event.key, event.value)
            value = None if event.value is None else json.dumps(json.loads(event.value)).encode()
            return Event(topic, event.partition, json.dumps(json.loads(event.key)).encode(), value)

        respelled = [respell(event) for event in events]
        produced = produce(bootstrap, respelled)
        found = out[name] = Input(name, topic, 4, produced, workload=workload)
        found.bytes_per_record = sum(len(e.value or b"") for e in respelled) / produced
        print(f"{name}: {produced:,} records in {topic}, {found.bytes_per_record:,.0f} B/value", flush=True)
    return out


def capture_inputs(args, bootstrap: str, rows: list[str], tmp: Path, registry: str | None,
                   topics: list[str]) -> tuple[dict, dict]:
    """The capture's topics (see the module docstring); each topic made is added to `topics`."""
    captured: CapturedTopics = capture(bootstrap, args.changes, tmp)
    topics += [captured.with_schemas, captured.without_schemas]
    out = {}
    sources = {"schemas": captured.with_schemas, "plain": captured.without_schemas, "avro": captured.with_schemas}
    for name in rows:
        kind, partitions = name.split("-")[1], int(name[-1])
        topic = f"bench.realistic.{name}.{uuid.uuid4().hex[:8]}"
        convert = None
        if kind == "avro":
            convert = ConnectAvroConverter(SchemaRegistryClient(registry), topic).convert
        topics.append(topic)
        count, size = copy_topic(bootstrap, sources[kind], topic, partitions, convert)
        found = out[name] = Input(name, topic, partitions, count, "avro" if kind == "avro" else "json",
                                  source_rows=captured.rows)
        found.bytes_per_record = size / count
        print(f"{name}: {count:,} records in {topic}, {found.bytes_per_record:,.0f} B/value", flush=True)
    info = {"records": captured.records, "changes": captured.changes, "live_rows": len(captured.rows),
            "timings": captured.timings}
    return out, info


# --- the service ------------------------------------------------------------------------------

def configure(path: Path, row: Input, registry: str | None, metrics_port: int | None, shape: dict | None = None,
              **top) -> None:
    """Set the pipeline's format (and the registry), its table shape, the metrics port and top-level keys of a
    config."""
    config = yaml.safe_load(path.read_text())
    if shape:
        config["pipelines"][0]["table_shape"] = shape
    if row.format == "avro":
        config["pipelines"][0]["format"] = "avro-confluent"
        config["schema_registry"] = {"url": registry}
    if metrics_port:
        config["metrics_port"] = metrics_port
    config.update(top)
    path.write_text(yaml.safe_dump(config))


class RangeScraper(threading.Thread):
    """Reads `cdc_ranges_total` from the service's /metrics every 0.5 s; keeps the last answer."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.url, self.ranges, self.stop = f"http://127.0.0.1:{port}/metrics", {}, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(_SCRAPE_S):
            try:
                text = requests.get(self.url, timeout=2).text
            except requests.RequestException:
                continue
            found = {decode: int(float(value)) for decode, value in _RANGES.findall(text)}
            if found:
                self.ranges = found


def decode_statistics(scraper: RangeScraper, log: Path) -> dict:
    """Ranges vectorised / record by record (the batches' log lines; the last scrape of /metrics where they do
    not say: a scrape misses the batches of the service's last half second) and the fallback reasons the log
    names."""
    text = log.read_text(errors="replace")
    reasons: Counter = Counter()
    for count, reason in _FALLBACK.findall(text):
        reasons[reason.strip()[:200]] += int(count)
    batches = [(int(total), int(bulk)) for total, bulk in _RANGES_READ.findall(text)]
    if batches:
        vectorised = sum(bulk for _, bulk in batches)
        record_by_record = sum(total for total, _ in batches) - vectorised
    else:
        vectorised, record_by_record = scraper.ranges.get("vectorised"), scraper.ranges.get("record_by_record")
    return {"vectorised": vectorised, "record_by_record": record_by_record,
            "fallback_ranges": sum(reasons.values()), "fallback_reasons": dict(reasons)}


def steady_stages(log: Path) -> dict | None:
    """Seconds the steady batches (2..N) spent reading, decoding and reducing (the micro-batch's job and the
    driver's gathering of its payloads) and merging (the commit), summed, from the service log's batch
    lines; None without a steady batch. The last merge is not overlapped by a next batch's job, so a run
    of one steady batch counts it whole."""
    found = [(int(batch), float(read), float(merge)) for batch, read, merge in _STAGES.findall(
        log.read_text(errors="replace"))]
    steady = [(read, merge) for batch, read, merge in found if batch > 0]
    if not steady:
        return None
    return {"batches": len(steady), "read_decode_reduce_s": sum(r for r, _ in steady),
            "merge_s": sum(m for _, m in steady)}


def steady_trigger(records: int, batches: int) -> int:
    """`max_offsets_per_trigger` that cuts `records` into `batches` batches (the last one the smallest)."""
    return -(-records // max(batches, 1))


def service_run(row: Input, bootstrap: str, registry: str | None, workdir: Path, variant: dict | None = None,
                max_offsets: int | None = None, shape: dict | None = None) -> dict:
    """`cdc-lakehouse run --until-idle` on the row's topic; figures, decode statistics, table check."""
    workdir.mkdir()
    if variant is None:
        config = ingest_config(workdir, bootstrap, row.topic, max_offsets)
    else:
        config = variant_config(workdir, bootstrap, row.topic, variant, max_offsets)
    port = free_port()
    configure(config, row, registry, port, shape)
    scraper = RangeScraper(port)
    scraper.start()
    try:
        run = run_pipeline(config, workdir / "pipeline.log")
    finally:
        scraper.stop.set()
    figures = service_figures(run, row.records, min(row.records, max_offsets or DEFAULT_MAX_OFFSETS_PER_TRIGGER))
    figures["decode"] = decode_statistics(scraper, workdir / "pipeline.log")
    figures["stages"] = steady_stages(workdir / "pipeline.log")
    figures["table_differs"] = row.check(str(workdir / "tables" / TABLE))
    figures["column_types"] = row.column_types(str(workdir / "tables" / TABLE))
    print(f"  {row.name} service{' ' + str(variant) if variant else ''}: {figures['steady_rate']:,.0f} steady "
          f"events/s ({figures['batches']} batches), table {'= source' if not figures['table_differs'] else 'DIFFERS: ' + figures['table_differs']}; "
          f"decode {figures['decode']}", flush=True)
    return figures


def naive_run(row: Input, bootstrap: str, registry: str | None, tmp: Path, window: int) -> dict:
    """The naive pipeline on the row's topic; its rate and its table's check."""
    uri = str(tmp / f"naive-{uuid.uuid4().hex[:8]}")
    if row.workload is not None:
        figures = run_naive(bootstrap, row.topic, row.partitions, uri, window)
    else:
        decode = AvroPayloads(registry) if row.format == "avro" else json_payload
        figures = run_naive_changes(bootstrap, row.topic, row.partitions, uri, decode, window)
    figures["rate"] = figures["records"] / figures["seconds"]
    figures["table_differs"] = row.check(uri)
    print(f"  {row.name} naive: {figures['rate']:,.0f} events/s, table "
          f"{'= source' if not figures['table_differs'] else 'DIFFERS: ' + figures['table_differs']}", flush=True)
    return figures


# --- freshness --------------------------------------------------------------------------------

class Replay:
    """The row's records (deletes and tombstones left out) as perf_freshness's stream: `events(n)` hands
    out the next n as (Event, key, clock) and `workload.table` is what the table must then hold."""

    def __init__(self, row: Input, bootstrap: str, registry: str | None, topic: str, count: int) -> None:
        decode = AvroPayloads(registry) if row.format == "avro" else json_payload
        self.items: list[tuple[Event, int, int]] = []
        self.emails: list[str] = []
        self.table: dict[int, dict] = {}
        self.workload = self
        for message in read_topic(bootstrap, row.topic, row.partitions):
            if message.value() is None:
                continue
            payload = decode(message.value())
            if payload["op"] == "d":
                continue
            after = payload["after"]
            self.items.append((Event(topic, message.partition(), message.key(), message.value()), after["id"],
                               int(_CLOCK.search(after["email"]).group(1))))
            self.emails.append(after["email"])
            if len(self.items) >= count:
                break
        self.handed = 0

    def events(self, count: int) -> list[tuple[Event, int, int]]:
        """The next `count` records; the expected table follows them."""
        out = self.items[self.handed:self.handed + count]
        for (_, key, _), email in zip(out, self.emails[self.handed:self.handed + count]):
            self.table[key] = {"email": email}
        self.handed += len(out)
        return out


def freshness_run(args, row: Input, bootstrap: str, registry: str | None, tmp: Path) -> dict:
    """The service (1 s trigger) while the row's records are replayed at `--rate` events/s."""
    topic = f"bench.realistic.fresh.{uuid.uuid4().hex[:8]}"
    workdir = tmp / f"fresh-{uuid.uuid4().hex[:8]}"
    workdir.mkdir()
    config = ingest_config(workdir, bootstrap, topic, None)
    configure(config, row, registry, None, trigger_interval_seconds=1)
    stream = Replay(row, bootstrap, registry, topic, args.warm_up_events + int(args.rate * args.rate_seconds))
    create_topics(bootstrap, [topic], row.partitions)
    service = Service(CLI, config, workdir / "service.log")
    uri = str(workdir / "tables" / TABLE)
    try:
        warm_up(bootstrap, stream, args.warm_up_events)
        service.start()
        first = service.first_commit(FIRST_COMMIT_TIMEOUT_S)
        if not wait_drained(uri, stream, service, args.drain_seconds):
            raise SystemExit("FAILED: the small first input never reached Delta")
        figures = phase(bootstrap, uri, stream, service, args.rate, args.rate_seconds, args.drain_seconds)
        figures.update(first_commit_s=first, rss_mib=service.peak_rss_mib)
    finally:
        service.stop()
        delete_topic(bootstrap, topic)
    print(f"  {row.name} freshness: {figures}", flush=True)
    return figures


# --- the table --------------------------------------------------------------------------------

def _rate(value) -> str:
    return f"{value:,.0f}" if value else "-"


def _check(figures: dict) -> str:
    if "table_differs" not in figures:
        return "-"
    return "yes" if figures["table_differs"] is None else "**NO**: " + figures["table_differs"][:120]


def table_lines(results: dict) -> list[str]:
    """The one Markdown table, then the decode statistics' fallback reasons per row."""
    rows = results["rows"]
    best = max((r.get("service", {}).get("steady_rate", 0) for r in rows.values()), default=0)
    lines = ["| input | records | B/value | naive ev/s | service steady ev/s (runs) | service/naive | vs best row | "
             "read floor ev/s (MB/s) | floor vs best row | read CPU us/record (readers + broker) | service MB/s | steady batches: read+decode+reduce / "
             "merge s | cores busy in the steady window: machine (service: driver / JVM / Python workers) | service table = source | naive table = source | materializer steady ev/s (its table) | "
             "freshness p95 (p50) | service peak RSS | ranges vectorised / record by record |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for name, row in rows.items():
        naive, service, floor = row.get("naive", {}), row.get("service", {}), row.get("floor", {})
        mat, fresh = row.get("materializer", {}), row.get("freshness", {})
        steady = service.get("steady_rate")
        ratio = f"x{steady / naive['rate']:.2f}" if steady and naive.get("rate") else "-"
        versus = f"x{steady / best:.2f}" if steady and best else "-"
        read = f"{_rate(floor['rate'])} ({floor['mb_s']:,.0f})" if floor.get("rate") else "-"
        ceiling = f"x{floor['rate'] / best:.2f}" if floor.get("rate") and best else "-"
        read_cpu = (f"{floor['reader_us']:.1f} + {floor['broker_us']:.1f}" if "broker_us" in floor
                    else f"{floor['reader_us']:.1f} + ?" if floor.get("reader_us") else "-")
        if "failed" in fresh:
            freshness = "FAILED"
        elif fresh:
            freshness = (f"{fresh['p95']:.1f} s ({fresh['p50']:.1f} s)" if fresh.get("drained")
                         else "did not catch up")
        else:
            freshness = "-"
        decode = service.get("decode", {})
        ranges = (f"{decode.get('vectorised')} / {decode.get('record_by_record')}" if decode else "-")
        for part in ("floor", "naive", "service", "materializer", "freshness"):
            if "failed" in row.get(part, {}):
                notes.append(f"- {name} {part}: FAILED {row[part]['failed']}")
        materialized = " (table = source)" if mat.get("table_differs", 0) is None else ""
        if mat.get("table_differs"):
            materialized = " (**table differs**)"
            notes.append(f"- {name} materializer: table differs from the source: {mat['table_differs'][:200]}")
        for reason, count in decode.get("fallback_reasons", {}).items():
            notes.append(f"- {name}: {count} range(s) record by record: {reason}")
        runs = (", ".join(_rate(rate) for rate in row.get("service_rates", []))
                or f"{service.get('batches', '-')} batches")
        throughput = f"{steady * row.get('bytes_per_record', 0) / 1e6:,.0f}" if steady else "-"
        stages = service.get("stages")
        spent = f"{stages['read_decode_reduce_s']:.2f} / {stages['merge_s']:.2f}" if stages else "-"
        busy = service.get("steady_cores")
        kinds = busy.get("kinds") if busy else None
        split = ": " + " / ".join(f"{kinds.get(kind, 0):.2f}" for kind in ("driver", "jvm", "python workers")) if kinds else ""
        cores = f"{busy['machine']:.2f} ({busy['tree']:.2f}{split})" if busy else "-"
        lines.append(f"| {name} | {row.get('records', 0):,} | {row.get('bytes_per_record', 0):,.0f} | "
                     f"{_rate(naive.get('rate'))} | {_rate(steady)} ({runs}) | "
                     f"{ratio} | {versus} | {read} | {ceiling} | {read_cpu} | {throughput} | {spent} | {cores} | {_check(service)} | "
                     f"{_check(naive)} | "
                     f"{_rate(mat.get('steady_rate'))}{materialized} | {freshness} | "
                     f"{_rate(service.get('rss_mib'))} MiB | {ranges} |")
    if best:
        cores = results.get("cores") or os.cpu_count() or 1
        lines += ["", f"CPU per record a row has at 0.7x of the best row's steady rate, every one of the "
                      f"{cores} cores busy: {cores / (0.7 * best) * 1e6:.1f} us (the read's share in the "
                      f"read CPU column)."]
    return lines + ([""] + notes if notes else [])


def median_run(runs: list[dict], key: str) -> dict:
    """The run of median `key` (the lower middle of an even count); a failed run, or one whose table
    differs, when there is one: it must show."""
    bad = [run for run in runs if "failed" in run or run.get("table_differs")]
    if bad:
        return bad[0]
    return sorted(runs, key=lambda run: run.get(key) or 0)[(len(runs) - 1) // 2]


def save(results: dict, path: str | None) -> None:
    """Write the figures so far."""
    if path:
        Path(path).write_text(json.dumps(results, indent=2, default=str))


def main(argv: list[str] | None = None) -> None:
    """Build the inputs, run every section on every row, print the table."""
    args = parse_args(argv)
    if args.from_json:
        print_results(json.loads(Path(args.from_json).read_text()))
        return
    results: dict = {"load_start": load(), "cores": os.cpu_count(), "args": {k: v for k, v in vars(args).items()}, "rows": {}}
    print(f"load at start: {results['load_start']['uptime']}", flush=True)
    workload_rows = [r for r in args.row_list if r.startswith("workload")]
    capture_rows = [r for r in args.row_list if r.startswith("capture")]
    topics: list[str] = []
    with tempfile.TemporaryDirectory(prefix="cdc-realistic-") as name, ExitStack() as stack:
        tmp = Path(name)
        broker = None if args.bootstrap else stack.enter_context(ApacheKafkaBroker(tmp / "broker"))
        bootstrap = args.bootstrap or broker.bootstrap_servers
        broker_pid = broker.pid if broker is not None else None
        registry = args.registry
        if registry is None and any("avro" in r for r in capture_rows):
            from tests.support.registry.apicurio import ApicurioRegistry

            registry = stack.enter_context(ApicurioRegistry(tmp / "apicurio")).url
        try:
            inputs: dict[str, Input] = {}
            if workload_rows:
                inputs.update(workload_inputs(args, bootstrap, workload_rows, topics))
            if capture_rows:
                found, info = capture_inputs(args, bootstrap, capture_rows, tmp, registry, topics)
                inputs.update(found)
                results["capture"] = info
            for row_name in args.row_list:  # every row's steady figures first, then the materializer, ...
                results["rows"][row_name] = {"records": inputs[row_name].records, "topic": inputs[row_name].topic,
                                             "bytes_per_record": inputs[row_name].bytes_per_record}
            shape = {"deletion_vectors": True} if args.deletion_vectors else None
            for section in [s for s in SECTIONS if s in args.section_list]:
                for row_name in args.row_list:
                    row, out = inputs[row_name], results["rows"][row_name]
                    print(f"{row_name} {section}:", flush=True)
                    if section == "steady":  # runs taken in turns, the median kept (one steady batch is noisy)
                        runs: dict[str, list[dict]] = {"naive": [], "service": []}
                        for _ in range(args.steady_runs):
                            attempt(out, "naive", lambda: naive_run(row, bootstrap, registry, tmp, args.naive_window))
                            attempt(out, "service", lambda: service_run(
                                row, bootstrap, registry, tmp / uuid.uuid4().hex[:8],
                                max_offsets=steady_trigger(row.records, args.steady_batches), shape=shape))
                            for part in runs:
                                runs[part].append(out[part])
                        out["naive"], out["service"] = median_run(runs["naive"], "rate"), median_run(
                            runs["service"], "steady_rate")
                        out["naive_rates"] = [run.get("rate") for run in runs["naive"]]
                        out["service_rates"] = [run.get("steady_rate") for run in runs["service"]]
                    elif section == "floor":
                        attempt(out, "floor", lambda: read_floor(bootstrap, row.topic, broker_pid=broker_pid))
                    elif section == "materializer":
                        attempt(out, "materializer", lambda: service_run(
                            row, bootstrap, registry, tmp / uuid.uuid4().hex[:8], {"upsert_materialize": "force"},
                            args.materializer_batch, shape))
                    else:
                        attempt(out, "freshness", lambda: freshness_run(args, row, bootstrap, registry, tmp))
                    save(results, args.json)
        finally:
            for topic in topics:
                try:
                    delete_topic(bootstrap, topic)
                except Exception as error:  # noqa: BLE001 - report and go on deleting
                    print(f"WARNING: could not delete {topic}: {error}", file=sys.stderr)
    results["load_end"] = load()
    save(results, args.json)
    print_results(results)


def print_results(results: dict) -> None:
    """The load before and after, the capture, the table."""
    print(f"\nload at start: {results['load_start']['uptime']}")
    print(f"load at end:   {results.get('load_end', {}).get('uptime', '- (an unfinished run)')}\n")
    if "capture" in results:
        print(f"capture: {results['capture']}\n")
    print("\n".join(table_lines(results)))


if __name__ == "__main__":
    main()
