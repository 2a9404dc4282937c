"""Debezium JSON envelopes in Kafka -> `cdc-lakehouse run --until-idle` -> Delta tables equal
to a dictionary replay; idempotent re-runs; SIGKILL in the middle loses and doubles nothing."""

from __future__ import annotations

import re

import pytest

from service.operations.workload import DebeziumWorkload, create_topics, produce
from tests.support.pipeline_harness import (
    kill_group,
    run_cli,
    start_cli,
    table_rows,
    table_version,
    wait_for_table,
    write_config,
)

pytestmark = pytest.mark.slow
SCHEMA_MODES = ("always", "never", "mixed")


def _workloads(unique: str, events_per_topic: int, keys: int) -> list[DebeziumWorkload]:
    return [
        DebeziumWorkload(f"db.{mode}.{unique}", 4, mode, seed=i, with_timestamp=True)
        for i, mode in enumerate(SCHEMA_MODES)
    ]


def _pipelines(workloads: list[DebeziumWorkload], max_per_trigger: int | None = None) -> list[dict]:
    pipelines = []
    for w in workloads:
        pipeline = {"name": f"p_{w.schema_mode}", "topics": [w.topic], "table": f"t_{w.schema_mode}",
                    "primary_key": ["id"]}
        if max_per_trigger:
            pipeline["max_offsets_per_trigger"] = max_per_trigger
        pipelines.append(pipeline)
    return pipelines


def _load(kafka_bootstrap: str, workloads: list[DebeziumWorkload], events: int, keys: int) -> int:
    for w in workloads:
        create_topics(kafka_bootstrap, [w.topic], w.partitions)
    return sum(produce(kafka_bootstrap, w.generate(events, keys)) for w in workloads)


def _assert_tables_match(workdir, workloads) -> None:
    for w in workloads:
        assert table_rows(workdir / "tables" / f"t_{w.schema_mode}") == w.expected_rows(), w.schema_mode


def test_until_idle_matches_replay_and_reruns_change_nothing(kafka_bootstrap, unique, workdir):
    workloads = _workloads(unique, 0, 0)
    workloads[-1].partitions = 1  # Debezium's default: its range is read in pieces, one per core
    produced = _load(kafka_bootstrap, workloads, 6_700, 1_500)
    assert produced >= 20_000
    config = write_config(workdir / "config.yaml", kafka_bootstrap, workdir, _pipelines(workloads))
    first = run_cli(config, "--until-idle")
    assert first.returncode == 0, first.stderr[-3000:]
    _assert_tables_match(workdir, workloads)
    # Every range of these plain Debezium topics (bare, wrapped, mixed) took the vectorised decode.
    output = first.stdout + first.stderr
    assert all(f"pipeline p_{mode}: batch 0 ->" in output for mode in SCHEMA_MODES), output[-3000:]
    assert "decoded record by record" not in output, output[-3000:]
    pieces = re.search(rf"pipeline p_{SCHEMA_MODES[-1]}: batch 0 -> .* from (\d+) Kafka range", output)
    assert pieces is not None and int(pieces.group(1)) >= 2, output[-3000:]
    versions = {w.topic: table_version(workdir / "tables" / f"t_{w.schema_mode}") for w in workloads}
    second = run_cli(config, "--until-idle")
    assert second.returncode == 0, second.stderr[-3000:]
    assert {w.topic: table_version(workdir / "tables" / f"t_{w.schema_mode}") for w in workloads} == versions


@pytest.mark.parametrize("engine", ["delta-rs", "delta-spark"])
def test_sigkill_mid_run_then_restart_ends_exactly_equal(kafka_bootstrap, unique, workdir, engine):
    # delta-rs: a plain pipeline and a materializer pipeline (its state recovered from RocksDB's
    # changelog files of the checkpoint) in the one service the kill takes down; delta-spark: a plain one.
    workloads = _workloads(unique, 0, 0)[:2 if engine == "delta-rs" else 1]
    _load(kafka_bootstrap, workloads, 8_000, 1_000)
    # delta-spark's MERGE and the materializer's state commit cost a fixed time per micro-batch: fewer,
    # larger ones (six). The kill still lands before RocksDB's first snapshot (every 10 batches). The
    # plain delta-rs pipeline takes twenty, so that it is still running when the materializer's third
    # batch is committed.
    pipelines = _pipelines(workloads, 1400 if engine == "delta-spark" else 400)
    if engine == "delta-rs":
        pipelines[1].update(upsert_materialize="force", max_offsets_per_trigger=1400)
    config = write_config(workdir / "config.yaml", kafka_bootstrap, workdir, pipelines, engine)
    uris = [workdir / "tables" / f"t_{w.schema_mode}" for w in workloads]
    process = start_cli(config, log=workdir / "killed.log")
    for uri in uris:
        wait_for_table(uri, lambda: table_version(uri) >= 3, process, workdir / "killed.log")
    kill_group(process)
    for uri, workload in zip(uris, workloads):
        print(f"{uri.name}: killed at version {table_version(uri)}")
        assert table_rows(uri) != workload.expected_rows(), f"{uri.name}: killed too late to test anything"
    # The restart replays the batch the kill interrupted at the offsets its offset log holds, then
    # takes the rest in one micro-batch (no admission limit): the recovery is the same, with fewer batches.
    unlimited = [{k: v for k, v in pipeline.items() if k != "max_offsets_per_trigger"} for pipeline in pipelines]
    config = write_config(workdir / "restart.yaml", kafka_bootstrap, workdir, unlimited, engine)
    restarted = run_cli(config, "--until-idle")
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    _assert_tables_match(workdir, workloads)
    # A lost state would show: the retractions of rows applied before the kill would find nothing.
    assert "found no live row to retract" not in restarted.stdout + restarted.stderr
