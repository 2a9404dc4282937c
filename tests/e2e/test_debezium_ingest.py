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


@pytest.mark.parametrize(("materialize", "engine"), [(False, "delta-rs"), (True, "delta-rs"), (False, "delta-spark")],
                         ids=["plain", "materializer", "plain-delta-spark"])
def test_sigkill_mid_run_then_restart_ends_exactly_equal(kafka_bootstrap, unique, workdir, materialize, engine):
    # The materializer's state is recovered from RocksDB's changelog files of the checkpoint.
    workloads = _workloads(unique, 0, 0)[:1]
    _load(kafka_bootstrap, workloads, 8_000, 1_000)
    # delta-spark's MERGE and the materializer's state commit cost a fixed time per micro-batch: fewer,
    # larger ones (six, not twelve). The kill still lands before RocksDB's first snapshot (every 10 batches).
    pipelines = _pipelines(workloads, 1400 if engine == "delta-spark" or materialize else 700)
    if materialize:
        pipelines[0]["upsert_materialize"] = "force"
    config = write_config(workdir / "config.yaml", kafka_bootstrap, workdir, pipelines, engine)
    uri = workdir / "tables" / f"t_{workloads[0].schema_mode}"
    process = start_cli(config, log=workdir / "killed.log")
    wait_for_table(uri, lambda: table_version(uri) >= 3, process, workdir / "killed.log")
    kill_group(process)
    assert table_rows(uri) != workloads[0].expected_rows(), "killed too late to test anything"
    # The restart replays the batch the kill interrupted at the offsets its offset log holds, then
    # takes the rest in one micro-batch (no admission limit): the recovery is the same, with fewer batches.
    unlimited = [{k: v for k, v in pipelines[0].items() if k != "max_offsets_per_trigger"}]
    config = write_config(workdir / "restart.yaml", kafka_bootstrap, workdir, unlimited, engine)
    restarted = run_cli(config, "--until-idle")
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    _assert_tables_match(workdir, workloads)
    # A lost state would show: the retractions of rows applied before the kill would find nothing.
    assert "found no live row to retract" not in restarted.stdout + restarted.stderr
