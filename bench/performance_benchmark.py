"""Performance benchmark: everything the service does against plain yardsticks, one run, one table.

On one embedded broker (each topic deleted after its sections: the broker holds everything in
memory), with a synthetic Debezium workload (`service.operations.workload`, half of the envelopes with the
Connect schema block):

- consumer:     a plain confluent-kafka consumer reads the topic (records/s).
- naive:        a naive single-process pipeline (`perf_naive.py`): last change per key per
                50,000 records, one delta-rs MERGE each; its table checked against the replay.
- service:      `cdc-lakehouse run CONFIG --until-idle` with the service's defaults, as a
                subprocess: wall events/s from launch to exit, steady events/s over the batches
                after the first (from its own log lines: the end of the first batch's job to the
                last batch's commit), launch to the first commit, peak RSS
                of the process tree (driver, JVM, Python workers); table checked against the replay.
- materializer: `upsert_materialize: force` with batches of `--materializer-batch` records,
                steady events/s against the plain path at the same batch size.
- history:      `history:` (SCD type 2, `sequence_by: [ts_ms]`) on, batches of `--history-batch` records,
                steady events/s against the plain path at the same batch size on the same topic; the
                current table checked against the replay, the history's open versions too.
- whole:        the consumer, the naive pipeline and the service on a `--whole-events` topic.
- export:       `export_benchmark.py`'s path on `--export-changes` change-feed rows (rows/s,
                peak RSS), in a process of its own (`perf_export.py`).
- freshness:    `cdc-lakehouse run` with a 1 s trigger while a producer writes a steady
                `--rate` events/s for `--rate-seconds`; event-to-Delta latency p50/p95
                (`perf_freshness.py`); the time from launch to the first commit of a small input.
- maxrate:      (`--find-max-rate`) steps the input rate up in the same service process until
                p95 reaches `--max-p95` s; the highest rate below it.

    nice -n 10 .venv/bin/python bench/performance_benchmark.py --events 20000 --keys 5000 \\
        --whole-events 0 --export-changes 20000 --rate 1000 --rate-seconds 20
    nice -n 10 .venv/bin/python bench/performance_benchmark.py --json perf.json       # the defaults
    nice -n 10 .venv/bin/python bench/performance_benchmark.py --only freshness,maxrate --find-max-rate
    nice -n 10 .venv/bin/python bench/performance_benchmark.py --only history --events 100000 --keys 20000
    .venv/bin/python bench/performance_benchmark.py --from-json perf.json               # its table again
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

import yaml
from deltalake import DeltaTable
from ingest_benchmark import TABLE, consume_all, delete_topic, run_pipeline
from ingest_benchmark import write_config as ingest_config
from materializer_benchmark import write_config as variant_config
from perf_freshness import Service, UpsertStream, phase, wait_drained, warm_up
from perf_naive import SCHEMA, run_naive

from connectors.delta.table_scan import scan
from connectors.kafka.apache_broker import ApacheKafkaBroker
from service.config.history import DELETED, END_AT, HISTORY_TABLE_SUFFIX
from service.config.settings import DEFAULT_MAX_OFFSETS_PER_TRIGGER
from service.operations.workload import DebeziumWorkload, create_topics, produce

SECTIONS = ("consumer", "naive", "service", "materializer", "history", "whole", "export", "freshness", "maxrate")
DEFAULT_SECTIONS = SECTIONS[:-1]
HISTORY_VARIANT = {"history": {"sequence_by": ["ts_ms"]}}
"""A history as a user of the synthetic workload configures it (its envelopes carry no `source.lsn`)."""
CLI = str(Path(sys.executable).with_name("cdc-lakehouse"))
BENCH = Path(__file__).resolve().parent
BUSY_LOAD = 1.5
FIRST_COMMIT_TIMEOUT_S = 600.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line flags."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--only", default=",".join(DEFAULT_SECTIONS),
                        help=f"comma-separated sections out of {','.join(SECTIONS)}")
    parser.add_argument("--events", type=int, default=300_000, help="records of the main topic (about)")
    parser.add_argument("--keys", type=int, default=100_000, help="distinct primary keys")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--naive-window", type=int, default=50_000, help="records per MERGE of the naive pipeline")
    parser.add_argument("--materializer-batch", type=int, default=10_000, help="max_offsets_per_trigger")
    parser.add_argument("--history-batch", type=int, default=20_000, help="history: max_offsets_per_trigger")
    parser.add_argument("--whole-events", type=int, default=1_000_000, help="records of the 'whole' topic")
    parser.add_argument("--export-changes", type=int, default=1_000_000, help="change-feed rows to export")
    parser.add_argument("--rate", type=float, default=5_000, help="freshness: steady input events/s")
    parser.add_argument("--rate-seconds", type=float, default=60, help="freshness: seconds of steady input")
    parser.add_argument("--warm-up-events", type=int, default=1_000, help="freshness: the small first input")
    parser.add_argument("--drain-seconds", type=float, default=180, help="freshness: wait for the table at most")
    parser.add_argument("--find-max-rate", action="store_true", help="add the maxrate section")
    parser.add_argument("--rate-steps", default="1000,2000,3000,5000,7500,10000,15000,20000,30000,50000",
                        help="maxrate: input rates tried in order")
    parser.add_argument("--step-seconds", type=float, default=30, help="maxrate: seconds per rate")
    parser.add_argument("--max-p95", type=float, default=5.0, help="maxrate: the p95 latency bound, seconds")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON ('-': stdout)")
    parser.add_argument("--from-json", metavar="PATH", help="run nothing: print the table of an earlier --json")
    args = parser.parse_args(argv)
    args.sections = [s.strip() for s in args.only.split(",") if s.strip()]
    if args.find_max_rate and "maxrate" not in args.sections:
        args.sections.append("maxrate")
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {','.join(SECTIONS)}")
    return args


def load() -> dict[str, float | str]:
    """`uptime`, and the 1-minute load average."""
    text = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    one_minute = os.getloadavg()[0]
    if one_minute > BUSY_LOAD:
        print(f"WARNING: load {one_minute:.2f} > {BUSY_LOAD}: the machine is busy, figures are lower than on a quiet one",
              flush=True)
    return {"uptime": text, "load1": one_minute}


def check_replay(uri: str, workload: DebeziumWorkload) -> int:
    """Fail loudly unless the Delta table equals the replay of the workload (rows and values)."""
    table = scan(DeltaTable(uri)).read_all().select(SCHEMA.names).sort_by("id")
    if table.to_pylist() != workload.expected_rows():
        raise SystemExit(f"FAILED: {uri} ({table.num_rows} rows) differs from the replay "
                         f"({len(workload.table)} live keys)")
    return table.num_rows


def check_history(uri: str, workload: DebeziumWorkload) -> int:
    """Fail loudly unless the history table's open versions equal the replay of the workload."""
    history = DeltaTable(uri).to_pyarrow_table()
    open_rows = [{name: row[name] for name in SCHEMA.names} for row in history.to_pylist()
                 if row[END_AT] is None and not row[DELETED]]
    if sorted(open_rows, key=lambda row: row["id"]) != workload.expected_rows():
        raise SystemExit(f"FAILED: {uri}: {len(open_rows)} open versions differ from the replay "
                         f"({len(workload.table)} live keys)")
    return history.num_rows


def attempt(out: dict, name: str, step: Callable[[], dict]) -> None:
    """out[name] = step(), or {'failed': reason} when it fails loudly (the run goes on)."""
    try:
        out[name] = step()
    except SystemExit as failure:
        lines = str(failure).splitlines()
        errors = [line for line in lines if line.startswith("error:")]
        out[name] = {"failed": (errors or lines or ["?"])[-1][:300]}
        print(f"  {name}: FAILED {out[name]['failed']}", flush=True)


def _rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def service_figures(run: dict[str, float], events: int, first_batch_records: int) -> dict[str, float]:
    """Wall, steady (batches 2..N) and launch-to-first-commit figures of one `run --until-idle`."""
    first_commit = run["startup"] + run["ingest"] - run["after_first"] + run.get("first_merge", 0.0)
    steady = _rate(events - first_batch_records, run["after_first"]) if run["batches"] > 1 else 0.0
    return {"events": events, "wall_s": run["wall"], "wall_rate": events / run["wall"], "steady_rate": steady,
            "first_commit_s": first_commit, "batches": run["batches"], "rss_mib": run["rss_mib"],
            "steady_cores": run.get("steady_cores")}


def run_service(workdir: Path, bootstrap: str, topic: str, workload: DebeziumWorkload, events: int,
                variant: dict | None = None, max_offsets: int | None = None) -> dict[str, float]:
    """`cdc-lakehouse run --until-idle` on `topic` in a fresh directory; its table checked; its figures."""
    workdir.mkdir()
    if variant is None:
        config = ingest_config(workdir, bootstrap, topic, max_offsets)
    else:
        config = variant_config(workdir, bootstrap, topic, variant, max_offsets)
    run = run_pipeline(config, workdir / "pipeline.log")
    check_replay(str(workdir / "tables" / TABLE), workload)
    first_batch = min(events, max_offsets or DEFAULT_MAX_OFFSETS_PER_TRIGGER)
    figures = service_figures(run, events, first_batch)
    print(f"  service{' ' + str(variant) if variant else ''}: {figures['wall_rate']:,.0f} events/s wall, "
          f"{figures['steady_rate']:,.0f} steady, table = replay", flush=True)
    return figures


def consumer_figures(bootstrap: str, topic: str, partitions: int, produced: int) -> dict[str, float]:
    """The plain consumer reads the whole topic."""
    consumed, seconds = consume_all(bootstrap, topic, partitions)
    if consumed != produced:
        raise SystemExit(f"FAILED: plain consumer read {consumed} of {produced} records")
    print(f"  consumer: {consumed / seconds:,.0f} records/s", flush=True)
    return {"records": consumed, "seconds": seconds, "rate": consumed / seconds}


def naive_figures(args: argparse.Namespace, bootstrap: str, topic: str, tmp: Path,
                  workload: DebeziumWorkload) -> dict[str, float]:
    """The naive pipeline into a new table, checked against the replay."""
    uri = str(tmp / f"naive-{uuid.uuid4().hex[:8]}")
    naive = run_naive(bootstrap, topic, args.partitions, uri, args.naive_window)
    check_replay(uri, workload)
    print(f"  naive: {naive['records'] / naive['seconds']:,.0f} events/s, table = replay", flush=True)
    return {**naive, "rate": naive["records"] / naive["seconds"]}


def topic_sections(args: argparse.Namespace, bootstrap: str, tmp: Path, events: int,
                   sections: list[str]) -> dict[str, dict]:
    """Produce one workload topic, run the `sections` on it, delete it."""
    out: dict = {}
    topic = f"bench.perf.{uuid.uuid4().hex[:12]}"
    workload = DebeziumWorkload(topic, args.partitions, schema="mixed", seed=11)
    generated = workload.generate(events, args.keys)
    create_topics(bootstrap, [topic], args.partitions)
    try:
        started = time.perf_counter()
        produced = produce(bootstrap, generated)
        del generated
        out["events"] = produced
        print(f"topic {topic}: {produced:,} records, {len(workload.table):,} live keys, "
              f"produced in {time.perf_counter() - started:.1f} s", flush=True)
        if "consumer" in sections:
            attempt(out, "consumer", lambda: consumer_figures(bootstrap, topic, args.partitions, produced))
        if "naive" in sections:
            attempt(out, "naive", lambda: naive_figures(args, bootstrap, topic, tmp, workload))
        if "service" in sections:
            attempt(out, "service", lambda: run_service(tmp / uuid.uuid4().hex[:8], bootstrap, topic, workload,
                                                        produced))
        if "materializer" in sections:
            for name, variant in (("plain_small_batches", {}), ("materializer", {"upsert_materialize": "force"})):
                attempt(out, name, lambda variant=variant: run_service(  # type: ignore[misc]
                    tmp / uuid.uuid4().hex[:8], bootstrap, topic, workload, produced, variant,
                    args.materializer_batch))
        if "history" in sections:
            attempt(out, "history_plain", lambda: plain_run(tmp / uuid.uuid4().hex[:8], bootstrap, topic, workload,
                                                            produced, args.history_batch))
            attempt(out, "history", lambda: history_run(tmp / uuid.uuid4().hex[:8], bootstrap, topic, workload,
                                                        produced, args.history_batch))
    finally:
        delete_topic(bootstrap, topic)
    return out


_STAGE_LINE = re.compile(r"batch (\d+) -> .*\(read\+decode\+reduce ([\d.]+)s, merge ([\d.]+)s\)")
_HISTORY_LINE = re.compile(r"history \S+: batch (\d+): .*\(([\d.]+)s\)")


def stage_medians(log_path: Path) -> dict[str, float]:
    """Per batch after the first, the median seconds of the service's stages (its log lines): read, decode
    and reduce; both MERGEs; of them the history's commit (0 without a history)."""
    text = log_path.read_text()
    stages = [(float(r), float(m)) for b, r, m in _STAGE_LINE.findall(text) if int(b) > 0]
    history = [float(h) for b, h in _HISTORY_LINE.findall(text) if int(b) > 0]
    if not stages:
        return {}
    return {"reduce_s": statistics.median(r for r, _ in stages), "merge_s": statistics.median(m for _, m in stages),
            "history_s": statistics.median(history) if history else 0.0}


def plain_run(workdir: Path, bootstrap: str, topic: str, workload: DebeziumWorkload, events: int,
              max_offsets: int) -> dict[str, float]:
    """`run_service` of the plain pipeline at the history's batch size, with its stage medians."""
    figures = run_service(workdir, bootstrap, topic, workload, events, {}, max_offsets)
    return {**figures, **stage_medians(workdir / "pipeline.log")}


def history_run(workdir: Path, bootstrap: str, topic: str, workload: DebeziumWorkload, events: int,
                max_offsets: int) -> dict[str, float]:
    """`run_service` with `HISTORY_VARIANT`; the history table checked too; the stage medians."""
    figures = run_service(workdir, bootstrap, topic, workload, events, HISTORY_VARIANT, max_offsets)
    figures["history_rows"] = check_history(str(workdir / "tables" / f"{TABLE}{HISTORY_TABLE_SUFFIX}"), workload)
    return {**figures, **stage_medians(workdir / "pipeline.log")}


def _stages(figures: dict) -> str:
    """A run's stage medians, for the table (empty for figures recorded before they were)."""
    if "reduce_s" not in figures:
        return ""
    history = f", of it history {figures['history_s']:.2f} s" if figures.get("history_s") else ""
    return (f"per batch (median) read+decode+reduce {figures['reduce_s']:.2f} s, "
            f"merge {figures['merge_s']:.2f} s{history}")


def export_section(bootstrap: str, changes: int) -> dict[str, float]:
    """`perf_export.py` as a subprocess; its JSON figures."""
    done = subprocess.run([sys.executable, str(BENCH / "perf_export.py"), "--bootstrap", bootstrap,
                           "--changes", str(changes)], capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"FAILED: export exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    figures = json.loads(lines[-1])
    figures["rate"] = figures["feed_rows"] / figures["seconds"]
    print(f"  export: {figures['rate']:,.0f} rows/s", flush=True)
    return figures


def freshness_sections(args: argparse.Namespace, bootstrap: str, tmp: Path) -> dict[str, dict]:
    """One `cdc-lakehouse run` (1 s trigger): the small first input, the steady rate, the rate steps."""
    out: dict[str, dict] = {}
    topic = f"bench.fresh.{uuid.uuid4().hex[:12]}"
    workdir = tmp / f"fresh-{uuid.uuid4().hex[:8]}"
    workdir.mkdir()
    config = ingest_config(workdir, bootstrap, topic, None)
    settings = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**settings, "trigger_interval_seconds": 1}))
    uri = str(workdir / "tables" / TABLE)
    stream = UpsertStream(topic, args.partitions, args.keys)
    create_topics(bootstrap, [topic], args.partitions)
    service = Service(CLI, config, workdir / "service.log")
    try:
        warm_up(bootstrap, stream, args.warm_up_events)
        service.start()
        first = service.first_commit(FIRST_COMMIT_TIMEOUT_S)
        if not wait_drained(uri, stream, service, args.drain_seconds):
            raise SystemExit("FAILED: the small first input never reached Delta")
        out["startup"] = {"events": args.warm_up_events, "first_commit_s": first}
        print(f"  first commit of a small input {first:.1f} s after launch", flush=True)
        if "freshness" in args.sections:
            out["freshness"] = phase(bootstrap, uri, stream, service, args.rate, args.rate_seconds, args.drain_seconds)
            print(f"  freshness at {args.rate:,.0f}/s: {out['freshness']}", flush=True)
        if "maxrate" in args.sections:
            out["maxrate"] = find_max_rate(args, bootstrap, uri, stream, service)
        out["freshness_rss"] = {"rss_mib": service.peak_rss_mib}
    finally:
        service.stop()
        delete_topic(bootstrap, topic)
    if service.process.returncode not in (0, None):
        print(f"WARNING: the freshness service exited {service.process.returncode}; see {service.log}")
    return out


def find_max_rate(args: argparse.Namespace, bootstrap: str, uri: str, stream: UpsertStream,
                  service: Service) -> dict:
    """Step the input rate up until p95 reaches the bound (or the table does not catch up)."""
    steps, best = [], 0.0
    for rate in (float(r) for r in args.rate_steps.split(",")):
        figures = phase(bootstrap, uri, stream, service, rate, args.step_seconds, args.drain_seconds)
        steps.append(figures)
        print(f"  rate {rate:,.0f}/s: p95 {figures.get('p95', float('inf')):.2f} s", flush=True)
        passed = figures["drained"] and figures["p95"] < args.max_p95
        if not passed:
            break
        best = rate
    return {"steps": steps, "best_rate": best, "bound_s": args.max_p95, "step_seconds": args.step_seconds}


def ratio(value: float, base: float | None) -> str:
    """'x0.25' (two significant digits) or '' when there is no base."""
    return f"x{value / base:.2g}" if base and value else ""


def versus(value: float, base: float | None, name: str) -> str:
    """'x0.25 of NAME', or '' when there is no base."""
    found = ratio(value, base)
    return f"{found} of {name}" if found else ""


def table(results: dict, args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(what, figure, comparison) rows of the one printed table."""
    rows: list[tuple[str, str, str]] = []
    for label, part in (("", results.get("main", {})), ("1M: ", results.get("whole", {}))):
        for name, entry in list(part.items()):
            if isinstance(entry, dict) and "failed" in entry:
                rows.append((f"{label}{name}", "FAILED", entry["failed"]))
                del part[name]
        if "materializer" in part and "plain_small_batches" not in part:
            part.pop("materializer")
        if "history" in part and "history_plain" not in part:
            part.pop("history")
        naive = part.get("naive", {}).get("rate")
        consumer = part.get("consumer", {}).get("rate")
        size = f" ({part['events']:,} events)" if "events" in part else ""
        if "consumer" in part:
            rows.append((f"{label}plain consumer{size}", f"{consumer:,.0f} records/s", ""))
        if "naive" in part:
            rows.append((f"{label}naive pipeline", f"{naive:,.0f} events/s",
                         versus(naive, consumer, "consumer")))
        if "service" in part:
            service = part["service"]
            rows.append((f"{label}service run --until-idle, wall", f"{service['wall_rate']:,.0f} events/s",
                         ", ".join(filter(None, (versus(service["wall_rate"], naive, "naive"),
                                                 versus(service["wall_rate"], consumer, "consumer"),
                                                 f"{service['wall_s']:.1f} s")))))
            rows.append((f"{label}service steady (batches 2..{service['batches']})",
                         f"{service['steady_rate']:,.0f} events/s" if service["steady_rate"] else "- (1 batch)",
                         versus(service["steady_rate"], naive, "naive")))
            rows.append((f"{label}service launch -> first commit", f"{service['first_commit_s']:.1f} s", ""))
            rows.append((f"{label}service peak RSS (process tree)", f"{service['rss_mib']:,.0f} MiB", ""))
        if "materializer" in part:
            plain, mat = part["plain_small_batches"], part["materializer"]
            batch = args.materializer_batch
            rows.append((f"{label}plain path, batches of {batch:,}, steady", f"{plain['steady_rate']:,.0f} events/s",
                         versus(plain["steady_rate"], naive, "naive")))
            rows.append((f"{label}materializer (force), batches of {batch:,}, steady",
                         f"{mat['steady_rate']:,.0f} events/s",
                         ", ".join(filter(None, (versus(mat["steady_rate"], plain["steady_rate"], "the plain path"),
                                                 f"peak RSS {mat['rss_mib']:,.0f} MiB")))))
        if "history" in part:
            plain, history = part["history_plain"], part["history"]
            batch = args.history_batch
            rows.append((f"{label}plain path, batches of {batch:,}, steady", f"{plain['steady_rate']:,.0f} events/s",
                         ", ".join(filter(None, (f"{plain['batches']} batches", _stages(plain))))))
            rows.append((f"{label}history (scd2) on, batches of {batch:,}, steady",
                         f"{history['steady_rate']:,.0f} events/s",
                         ", ".join(filter(None, (versus(history["steady_rate"], plain["steady_rate"], "the plain path"),
                                                 f"{history['history_rows']:,} history rows",
                                                 f"peak RSS {history['rss_mib']:,.0f} MiB", _stages(history))))))
    for name in ("export", "freshness"):
        if "failed" in results.get(name, {}):
            rows.append((name, "FAILED", results.pop(name)["failed"]))
    if "export" in results:
        export = results["export"]
        rows.append((f"export of {export['feed_rows']:,} change-feed rows", f"{export['rate']:,.0f} rows/s",
                     f"{export['seconds']:.1f} s, peak RSS {export['rss_mib']:,.0f} MiB"))
    fresh = results.get("freshness", {})
    if "startup" in fresh:
        rows.append((f"run -> first commit, small input ({fresh['startup']['events']:,} events)",
                     f"{fresh['startup']['first_commit_s']:.1f} s", "1 s trigger"))
    if "freshness" in fresh:
        phase_ = fresh["freshness"]
        figure = f"p50 {phase_['p50']:.1f} s, p95 {phase_['p95']:.1f} s" if phase_["drained"] else "did not catch up"
        rows.append((f"event-to-Delta latency at {phase_['rate']:,.0f} events/s for {phase_['seconds']:.0f} s",
                     figure, f"produced {phase_['produced_rate']:,.0f}/s, {phase_['events']:,} events"
                             + (f", max {phase_['max']:.1f} s" if phase_["drained"] else "")))
    if "maxrate" in fresh:
        found = fresh["maxrate"]
        tried = ", ".join(f"{s['rate']:,.0f}: " + (f"{s['p95']:.1f} s" if s["drained"] else "behind")
                          for s in found["steps"])
        best = (f"{found['best_rate']:,.0f} events/s" if found["best_rate"]
                else f"below {found['steps'][0]['rate']:,.0f} events/s")
        rows.append((f"highest steady rate with p95 < {found['bound_s']:.0f} s", best,
                     f"p95 per rate ({found['step_seconds']:.0f} s each): {tried}"))
    if "freshness_rss" in fresh:
        rows.append(("freshness service peak RSS (process tree)", f"{fresh['freshness_rss']['rss_mib']:,.0f} MiB", ""))
    return rows


def print_table(results: dict, args: argparse.Namespace) -> None:
    """The one table, as Markdown, with the load before and after."""
    print(f"\nload at start: {results['load_start']['uptime']}")
    print(f"load at end:   {results.get('load_end', {}).get('uptime', '-')}\n")
    print("| what | figure | compared |")
    print("|---|---|---|")
    for what, figure, compared in table(results, args):
        print(f"| {what} | {figure} | {compared} |")


def main(argv: list[str] | None = None) -> None:
    """Run the selected sections once and print the table."""
    args = parse_args(argv)
    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())
        print_table(results, argparse.Namespace(**results["args"]))
        return
    results: dict = {"load_start": load(), "args": vars(args)}
    main_sections = [s for s in ("consumer", "naive", "service", "materializer", "history") if s in args.sections]
    whole_sections = [s for s in ("consumer", "naive", "service") if "whole" in args.sections and args.whole_events]
    with tempfile.TemporaryDirectory(prefix="cdc-perf-") as name, ApacheKafkaBroker(Path(name) / "broker") as broker:
        tmp, bootstrap = Path(name), broker.bootstrap_servers
        if main_sections:
            results["main"] = topic_sections(args, bootstrap, tmp, args.events, main_sections)
            save(results, args.json, final=False)
        if whole_sections:
            results["whole"] = topic_sections(args, bootstrap, tmp, args.whole_events, whole_sections)
            save(results, args.json, final=False)
        if "export" in args.sections:
            attempt(results, "export", lambda: export_section(bootstrap, args.export_changes))
            save(results, args.json, final=False)
        if {"freshness", "maxrate"} & set(args.sections):
            attempt(results, "freshness", lambda: freshness_sections(args, bootstrap, tmp))
    results["load_end"] = load()
    save(results, args.json, final=True)
    print_table(results, args)


def save(results: dict, path: str | None, final: bool) -> None:
    """Write the figures so far as JSON to `path` ('-': stdout, at the end only)."""
    if not path or (path == "-" and not final):
        return
    text = json.dumps(results, indent=2, default=str)
    if path == "-":
        print(text)
    else:
        Path(path).write_text(text)


if __name__ == "__main__":
    main()
