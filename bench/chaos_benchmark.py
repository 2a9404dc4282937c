"""Chaos benchmark: SIGKILLs of the service and of the broker during one long run; nothing lost, nothing doubled.

Starts Apache Kafka (`ApacheKafkaBroker`, one KRaft node) on free ports in a temp dir and
`cdc-lakehouse run CONFIG` (not
--until-idle) with: an ingest pipeline of a Debezium topic with 4 partitions (table `plain`);
the materializer on two Debezium topics into one table (`dedup`: compaction watermark,
on_conflict deduplicate); an export of `plain` to a topic (Debezium envelopes, compaction none,
one record per change). While a feeder produces the workload (`chaos_workload.py`), the
service is killed with SIGKILL (its whole process group: driver, JVM, Python workers) at
`--kills` seeded random moments and restarted each time, and the broker process is SIGKILLed
`--broker-kills` times, mid-traffic, and restarted on the same log directory (the service rides
the outage out through its recovery settings).
Then the last contested keys are settled, the service is stopped with SIGTERM and
`run --until-idle` finishes. Checks (`chaos_checks.py`), from what Kafka and Delta hold:
each table equals the replay of its input topics; the export topic, read read_committed, holds
each change of `plain`'s change feed exactly once.

Moments (`chaos_service.py`): right after a launch, a fifth of the kills land during start-up
(1-25 s after launch), the others 0-8 s after the first batch of a pipeline picked at random;
after a broker kill, 0-8 s after every pipeline and the export committed a batch. Nothing is
paused around a broker kill: the feeder's idempotent producers retry until the restarted broker
acknowledges, and what the broker acknowledged before the kill must still be there.

The final rows of the dedup table must not depend on how the service interleaves its two
topics (see `chaos_workload.py`); the movers, one record per dedup partition an hour ahead in
event time, let the watermark pass everything else at the end and are left out of the check.

    .venv/bin/python bench/chaos_benchmark.py --kills 3 --broker-kills 1 --events 4000
    .venv/bin/python bench/chaos_benchmark.py                        # 20 kills, 2 broker kills
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import subprocess
import tempfile
import time
import zlib
from collections import Counter
from pathlib import Path

import yaml
from chaos_checks import (
    Comparison,
    compare_export,
    compare_table,
    read_topic,
    replay_deduplicate,
    replay_plain,
)
from chaos_service import BATCH, CLI, RESTART, Chaos, ServiceDown, run_chaos
from chaos_workload import (
    EXPORT,
    PARTITIONS,
    PLAIN,
    SOURCE_A,
    SOURCE_B,
    ChaosWorkload,
    Feeder,
    send,
)
from deltalake import DeltaTable

from connectors.kafka.apache_broker import ApacheKafkaBroker
from service.operations.workload import Event, create_topics

WATERMARK_DELAY_S = 5
STEP_ESTIMATE_S = 45.0  # launch, start-up and a few batches on two busy cores
LATE_TIMEOUT_S = 300.0
MOVER_AHEAD_MS = 3_600_000
MOVER_IDS = range(10_000_000, 10_000_100)
INPUT_CHECK = "input topics (acknowledged vs held)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line flags."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs of the service")
    parser.add_argument("--broker-kills", type=int, default=2,
                        help="SIGKILLs of the broker process, each restarted on the same log directory")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    parser.add_argument("--events", type=int, default=20_000,
                        help="records to produce while the chaos runs, at a steady rate (about; more if it runs long)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, tables, broker data)")
    return parser.parse_args(argv)


def write_config(workdir: Path, bootstrap: str) -> Path:
    """The service config: plain ingest, the dedup materializer, the export of `plain`."""
    config = {
        "kafka": {"bootstrap_servers": bootstrap},
        "lakehouse": {"root": str(workdir / "tables")},
        "checkpoint_root": str(workdir / "checkpoints"),
        "spark": {"master": "local[2]", "shuffle_partitions": 2},
        "recovery": {"max_attempts": 50, "initial_backoff_seconds": 1, "max_backoff_seconds": 4},
        "pipelines": [
            {"name": "plain", "topics": [PLAIN], "table": "plain", "primary_key": ["id"],
             "max_offsets_per_trigger": 2_000},
            {"name": "dedup", "topics": [SOURCE_A, SOURCE_B], "table": "dedup", "primary_key": ["id"],
             "on_conflict": "deduplicate", "compaction": "watermark", "watermark_delay_seconds": WATERMARK_DELAY_S,
             "max_offsets_per_trigger": 1_000},
        ],
        "exports": [{"name": "plain-export", "table": "plain", "topic": EXPORT, "primary_key": ["id"],
                     "preset": "debezium", "tombstones": False, "compaction": "none", "max_versions_per_trigger": 5}],
    }
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    check = subprocess.run([CLI, "validate", str(path)], capture_output=True, text=True)
    if check.returncode:
        raise SystemExit(f"config refused: {check.stderr.strip()}")
    return path



def wait_rows(chaos: Chaos, want: dict[int, dict], workload: ChaosWorkload, bootstrap: str, acked: Counter) -> bool:
    """Until the dedup table shows `want`; produces filler meanwhile so the watermark moves on."""
    uri, deadline = chaos.workdir / "tables" / "dedup", time.monotonic() + LATE_TIMEOUT_S
    while time.monotonic() < deadline:
        chaos.alive()
        try:
            rows = {r["id"]: r for r in DeltaTable(str(uri)).to_pyarrow_table().to_pylist() if r["id"] in want}
        except Exception:  # noqa: BLE001 - the table may be between versions
            rows = {}
        if rows == want:
            return True
        send(bootstrap, workload.filler(5), acked)
        time.sleep(1.0)
    return False


def finish(chaos: Chaos, workload: ChaosWorkload, bootstrap: str, feeder: Feeder) -> dict:
    """Settle contested keys, play the late claims in a known order, move the watermark past all."""
    feeder.finish()
    acked, notes = feeder.acked, []
    send(bootstrap, workload.settle_contested(), acked)
    late = {key: workload.a.table[key] for key in workload.keys.late_keys}
    notes.append(("A's late claims in the table", wait_rows(chaos, late, workload, bootstrap, acked)))
    send(bootstrap, workload.late_claims(), acked)
    late = {key: workload.b.table[key] for key in workload.keys.late_keys}
    notes.append(("B's late claims in the table", wait_rows(chaos, late, workload, bootstrap, acked)))
    send(bootstrap, workload.after_late_claims(), acked)
    movers = [Event(topic, partition, b'{"id": %d}' % key, _mover(key))
              for topic, partition, key in _mover_keys()]
    send(bootstrap, movers, acked, timestamp_ms=int(time.time() * 1000) + MOVER_AHEAD_MS)
    stopped = chaos.stop()
    started = time.monotonic()
    log = chaos.workdir / "until-idle.log"
    with log.open("wb") as handle:
        final = subprocess.run([CLI, "run", str(chaos.config), "--until-idle"], stdout=handle,
                               stderr=subprocess.STDOUT, timeout=3600)
    return {"notes": notes, "sigterm_exit": stopped, "final_exit": final.returncode,
            "final_s": time.monotonic() - started, "final_log": log}


def _mover(key: int) -> bytes:
    return b'{"before":null,"after":{"id":%d,"name":"mover"},"op":"c","ts_ms":0}' % key


def _mover_keys() -> list[tuple[str, int, int]]:
    """One mover id per partition of each dedup topic (the partition the workload's hashing picks)."""
    found = []
    for topic in (SOURCE_A, SOURCE_B):
        for partition in range(PARTITIONS[topic]):
            key = next(k for k in MOVER_IDS if zlib.crc32(b'{"id": %d}' % k) % PARTITIONS[topic] == partition)
            found.append((topic, partition, key))
    return found


def check(bootstrap: str, workdir: Path, acked: Counter) -> dict[str, Comparison]:
    """Input as acknowledged, tables equal to their replays, the export equal to the change feed."""
    inputs = {topic: read_topic(bootstrap, topic) for topic in (PLAIN, SOURCE_A, SOURCE_B)}
    held = Counter((r.topic, r.partition) for records in inputs.values() for r in records)
    kept = Comparison(expected=sum(acked.values()), found=sum(held.values()))
    for where in sorted(acked.keys() | held.keys()):
        difference = acked[where] - held[where]
        kept.lost, kept.extra = kept.lost + max(difference, 0), kept.extra + max(-difference, 0)
        if difference:
            kept.note(f"{where[0]}[{where[1]}]: {acked[where]} acknowledged, {held[where]} held")
    dedup = replay_deduplicate([inputs[SOURCE_A], inputs[SOURCE_B]], ignore=set(MOVER_IDS))
    tables = workdir / "tables"
    return {
        INPUT_CHECK: kept,
        "table plain vs replay": compare_table(str(tables / "plain"), replay_plain(inputs[PLAIN])),
        f"table dedup vs replay ({dedup.contested} keys with 2 live claims)":
            compare_table(str(tables / "dedup"), dedup.table, ignore=set(MOVER_IDS)),
        "export vs change feed of plain": compare_export(str(tables / "plain"), read_topic(bootstrap, EXPORT,
                                                                                            "read_committed")),
    }


def _count(logs: list[Path], pattern: str) -> int:
    return sum(len(re.findall(pattern, path.read_text(errors="replace"))) for path in logs if path.exists())


def report(args: argparse.Namespace, seed: int, chaos: Chaos, end: dict, checks: dict[str, Comparison],
           wall_s: float) -> bool:
    """Print the checks and the summary table; True when nothing was lost or doubled."""
    print(f"\n{'check':<58}{'expected':>9}{'found':>9}{'lost':>6}{'dup':>6}{'wrong':>6}{'extra':>6}")
    for name, c in checks.items():
        print(f"{name:<58}{c.expected:>9,}{c.found:>9,}{c.lost:>6}{c.duplicated:>6}{c.wrong:>6}{c.extra:>6}")
        for example in c.examples:
            print(f"    {example}")
    logs = [run.log for run in chaos.runs] + [end["final_log"]]
    ok = all(c.ok for c in checks.values()) and end["final_exit"] == 0
    # A kill is survived when the service committed again afterwards (in a later process, or the final run).
    survived = sum(1 for i in chaos.relaunched
                   if end["final_exit"] == 0 or any(BATCH.search(run.text()) for run in chaos.runs[i:]))
    lost = sum(c.lost + c.wrong for c in checks.values())
    kept = checks[INPUT_CHECK]
    rows = [
        ("seed", f"{seed}", f"--kills {args.kills} --broker-kills {args.broker_kills} --events {args.events}"),
        ("kills survived", f"{survived} of {chaos.kills}", f"{chaos.startup_kills} during start-up"),
        ("service restarts", f"{len(chaos.runs) - 1}", f"{len(chaos.unexpected_exits)} after an exit on its own"),
        ("broker kills survived", f"{chaos.broker_recoveries} of {chaos.broker_kills}",
         f"pipeline restarts by the service's recovery: {_count(logs, RESTART.pattern)}"),
        ("batches replayed, skipped", f"{_count(logs, r'already in (?:Delta|Kafka), skipped')}",
         "committed before a kill, replayed after it"),
        ("records produced", f"{kept.expected:,}", "acknowledged by the broker"),
        ("records lost", f"{lost}", "missing or wrong rows, unpublished changes, input lost by the broker"),
        ("records duplicated", f"{sum(c.duplicated for c in checks.values()) + kept.extra}",
         "table rows, export records, input records held more often than acknowledged"),
        ("final run --until-idle", f"{end['final_s']:.0f} s", f"exit {end['final_exit']}; SIGTERM exit "
                                                               f"{end['sigterm_exit']}"),
        ("wall time", f"{wall_s / 60:.1f} min", f"{chaos.stalls} waits for progress timed out"),
    ]
    print()
    for name, figure, note in rows:
        print(f"{name:<28}{figure:>14}   {note}")
    for note, done in end["notes"]:
        print(f"{note}: {'yes' if done else 'NO (timed out)'}")
    for exit_note in chaos.unexpected_exits:
        print(f"unexpected exit: {exit_note}")
    return ok


def run(args: argparse.Namespace, seed: int, workdir: Path, broker: ApacheKafkaBroker) -> bool:
    """The chaos, the end and the checks; True when nothing was lost, doubled or wrong."""
    rng, started = random.Random(seed), time.monotonic()
    steps = ["kill"] * args.kills + ["broker-kill"] * args.broker_kills
    rng.shuffle(steps)
    for topic, partitions in PARTITIONS.items():
        create_topics(broker.bootstrap_servers, [topic], partitions)
    workload = ChaosWorkload(seed, args.events)
    feeder = Feeder(broker.bootstrap_servers, workload.stream(), args.events / (STEP_ESTIMATE_S * len(steps)))
    chaos = Chaos(write_config(workdir, broker.bootstrap_servers), workdir)
    chaos.launch()
    feeder.start()
    try:
        run_chaos(chaos, broker, feeder, steps, rng)
        end = finish(chaos, workload, broker.bootstrap_servers, feeder)
    except ServiceDown as down:
        print(f"\nFAILED after {chaos.kills} kills (seed {seed}): {down}")
        for exit_note in chaos.unexpected_exits:
            print(f"unexpected exit: {exit_note}")
        return False
    finally:
        feeder.finish()
        if chaos.current.process.poll() is None:
            chaos.kill()
    checks = check(broker.bootstrap_servers, workdir, feeder.acked)
    return report(args, seed, chaos, end, checks, time.monotonic() - started)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark once; exit 1 when anything was lost, doubled or wrong (the work dir is kept)."""
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    print(f"chaos benchmark: seed {seed}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="cdc-chaos-"))
    ok = False
    with ApacheKafkaBroker(workdir / "broker") as broker:
        try:
            ok = run(args, seed, workdir, broker)
        finally:
            if args.keep or not ok:
                print(f"work dir kept: {workdir}")
    if not ok:
        raise SystemExit(1)
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
