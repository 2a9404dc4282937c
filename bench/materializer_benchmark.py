"""Materializer benchmark: state bytes per live key, and events/s with the materializer on versus off.

1. State bytes per live key, from the pure rules (`service.kafka_to_delta.materialize.rules`): the
   state text the Spark stage stores per primary key (RocksDB adds its own key and framing),
   for `error`, `nothing`, `deduplicate` and `error` with sequence_by, on rows shaped like the
   synthetic Debezium workload's (id, name, email, balance, active).
2. End to end: one synthetic Debezium workload (`service.operations.workload`) produced once, then
   `cdc-lakehouse run --until-idle` per variant on that same topic, each with its own table and
   checkpoint: `upsert_materialize: none` (per-batch reduction) against `force` (the keyed-state
   materializer, batch compaction) and `force` with sequence_by. Each table is checked to hold
   exactly the live keys. Timing as in `ingest_benchmark.py` (wall, and from the CLI's own log).

    .venv/bin/python bench/materializer_benchmark.py --events 50000 --keys 5000
    .venv/bin/python bench/materializer_benchmark.py --state-only
"""

from __future__ import annotations

import argparse
import logging
import random
import tempfile
import uuid
from pathlib import Path

import orjson
import yaml
from ingest_benchmark import PIPELINE, broker, delete_topic, run_pipeline, verify_table

from service.kafka_to_delta.materialize.rules import Change, Materializer, MaterializerConfig
from service.operations.workload import DebeziumWorkload, create_topics, produce
from vocabulary.changes import ChangeKind

VARIANTS = {
    "materializer off (none)": {"upsert_materialize": "none"},
    "materializer on (force, error)": {"upsert_materialize": "force"},
    "on, sequence_by ts_ms": {"upsert_materialize": "force", "sequence_by": ["ts_ms"]},
}
INS, UB, UA, DEL = ChangeKind.INSERT, ChangeKind.UPDATE_BEFORE, ChangeKind.UPDATE_AFTER, ChangeKind.DELETE


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line flags."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=50_000, help="records to produce (about)")
    parser.add_argument("--keys", type=int, default=5_000, help="distinct primary keys")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=10_000,
                        help="records per micro-batch (steady state is measured over batches 2..N)")
    parser.add_argument("--state-keys", type=int, default=20_000, help="keys for the state-bytes figures")
    parser.add_argument("--bootstrap", help="use this broker instead of starting Apache Kafka for the run")
    parser.add_argument("--state-only", action="store_true", help="only the state-bytes figures (no Spark)")
    return parser.parse_args(argv)


# ---- 1. state bytes per live key (pure rules) ----


def _canon(value) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _row(rng: random.Random, key: int, clock: int) -> str:
    return _canon({"id": key, "name": f"user-{key}-{rng.randrange(10**6)}", "email": f"u{key}.{clock}@example.com",
                   "balance": round(rng.uniform(-1e4, 1e4), 2), "active": rng.random() < 0.5})


def _changes(rng: random.Random, key: int, sources: int, sequenced: bool, delete: bool) -> list[list[Change]]:
    """Barriers for one key: each source inserts, then updates it twice; optionally the last source deletes."""
    barriers, clock = [], key * 10
    rows = {}
    for source in range(sources):
        upsert_key = _canon([f"topic-{source}", [key]]) if sources > 1 else _canon([key])
        for step in range(3):
            clock += 1
            row, old = _row(rng, key, clock), rows.get(upsert_key)
            position, sequence = (f"topic-{source}", key % 4, clock), ((clock,) if sequenced else None)
            kinds = [(INS, row)] if old is None else [(UB, old), (UA, row)]
            barriers.append([Change(kind, upsert_key, text, position, sequence) for kind, text in kinds])
            rows[upsert_key] = row
        if delete and source == sources - 1:
            clock += 1
            barriers.append([Change(DEL, upsert_key, rows[upsert_key], (f"topic-{source}", key % 4, clock),
                                    (clock,) if sequenced else None)])
    return barriers


def state_figures(keys: int) -> list[tuple[str, float, float, float]]:
    """(scenario, state bytes per live key, row bytes, state bytes per deleted key) over `keys` keys."""
    scenarios = [
        ("error, one source", "error", 1, False, 0.0),
        ("nothing, two sources claim each key", "nothing", 2, False, 0.0),
        ("deduplicate, two sources claim each key", "deduplicate", 2, False, 0.0),
        ("error + sequence_by, 10% of keys deleted", "error", 1, True, 0.1),
    ]
    out = []
    for name, strategy, sources, sequenced, deleted in scenarios:
        rules = Materializer(MaterializerConfig("bench", ("id",), strategy, tombstone_retention_ms=86_400_000))
        rng, row_bytes = random.Random(7), 0
        live_bytes, live_keys, dead_bytes, dead_keys = 0, 0, 0, 0
        for key in range(keys):
            state, delete = None, rng.random() < deleted
            for barrier in _changes(rng, key, sources, sequenced, delete):
                outcome = rules.apply(_canon([key]), state, barrier, now_ms=0)
                state = outcome.new_state
            if outcome.counters.live_rows:
                live_bytes, live_keys = live_bytes + outcome.counters.state_bytes, live_keys + 1
            else:
                dead_bytes, dead_keys = dead_bytes + outcome.counters.state_bytes, dead_keys + 1
            row_bytes += len(barrier[-1].row.encode())
        out.append((name, live_bytes / max(live_keys, 1), row_bytes / keys, dead_bytes / max(dead_keys, 1)))
    return out


# ---- 2. end to end: materializer on versus off ----


def write_config(workdir: Path, bootstrap: str, topic: str, variant: dict, max_offsets: int) -> Path:
    """A one-pipeline service config (pipeline name `bench`, as ingest_benchmark's log parsing expects)."""
    pipeline = {"name": PIPELINE, "topics": [topic], "table": "bench_customers", "primary_key": ["id"],
                "max_offsets_per_trigger": max_offsets, **variant}
    config = {"kafka": {"bootstrap_servers": bootstrap}, "lakehouse": {"root": str(workdir / "tables")},
              "checkpoint_root": str(workdir / "checkpoints"), "spark": {"master": "local[*]"},
              "pipelines": [pipeline]}
    path = workdir / "bench.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def end_to_end(args: argparse.Namespace, tmp: Path) -> list[tuple[str, dict]]:
    """Produce the workload once; run every variant on it; (variant, run figures)."""
    topic = f"bench.materializer.{uuid.uuid4().hex[:12]}"
    results = []
    with broker(args.bootstrap, tmp) as bootstrap:
        workload = DebeziumWorkload(topic, args.partitions, schema="never", seed=11)
        create_topics(bootstrap, [topic], args.partitions)
        try:
            produced = produce(bootstrap, workload.generate(args.events, args.keys))
            print(f"topic {topic}: {produced} records, {len(workload.table)} live keys")
            for name, variant in VARIANTS.items():
                workdir = tmp / uuid.uuid4().hex[:8]
                workdir.mkdir()
                config = write_config(workdir, bootstrap, topic, variant, args.max_offsets_per_trigger)
                run = run_pipeline(config, workdir / "pipeline.log")
                verify_table(str(workdir / "tables" / "bench_customers"), workload)
                run["events"], run["warm_events"] = produced, max(0, produced - args.max_offsets_per_trigger)
                results.append((name, run))
                print(f"  {name}: {run['wall']:.1f} s wall, table verified")
        finally:
            delete_topic(bootstrap, topic)
    return results


def report(states: list[tuple[str, float, float, float]], runs: list[tuple[str, dict]]) -> None:
    """Print the figures."""
    print("\nstate bytes per live key (the state text; 'row' is the row's own JSON size)")
    for name, per_key, row_bytes, tombstone in states:
        extra = f"; a deleted key keeps {tombstone:.0f} B (its tombstone)" if tombstone else ""
        print(f"  {name:<48}{per_key:>8.0f} B   row {row_bytes:.0f} B, x{per_key / row_bytes:.2f}{extra}")
    if not runs:
        return
    print("\nend to end (same topic), events/s; steady = batches 2..N over the time from the first to the last commit")
    base = _steady(runs[0][1])
    for name, run in runs:
        wall, steady = run["events"] / run["wall"], _steady(run)
        print(f"  {name:<32}{wall:>7,.0f} wall ({run['wall']:.1f} s)  {run['events'] / run['ingest']:>7,.0f} "
              f"excl. startup ({run['batches']} batches)  {steady:>7,.0f} steady  x{steady / base:.2f}  "
              f"peak RSS {run['rss_mib']:,.0f} MiB")


def _steady(run: dict) -> float:
    return run["warm_events"] / run["after_first"] if run["batches"] > 1 and run["after_first"] > 0 else 0.0


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark once."""
    args = parse_args(argv)
    # `nothing` logs every retraction of a claim it dropped; that is expected here.
    logging.getLogger("service.kafka_to_delta.materialize.rules").setLevel(logging.ERROR)
    states = state_figures(args.state_keys)
    runs: list[tuple[str, dict]] = []
    if not args.state_only:
        with tempfile.TemporaryDirectory(prefix="cdc-bench-") as tmp:
            runs = end_to_end(args, Path(tmp))
    report(states, runs)


if __name__ == "__main__":
    main()
