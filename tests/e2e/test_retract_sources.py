"""Retract sources (an update's -U and +U are separate records) under the materializer, through
`cdc-lakehouse`: `compaction` defaults to `watermark` for them, and `compaction: batch` with
`on_conflict: nothing` or `error` is refused (spec: on-conflict, barriers between UB/UA pairs).

The scenario: a flat op-coded topic with 2 partitions, table keyed by passenger, input upserted
by (passenger, seat). A passenger changes seat in one source transaction whose +U (partition 1)
is read a micro-batch before its -U (partition 0). Under batch compaction `nothing` ended with no
row for the passenger and `error` stopped on a conflict that never existed. The delay is the default
for such a source (5 s): with 0 the +U would be compacted alone once its partition is caught up.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from confluent_kafka import Producer

from service.operations.workload import create_topics
from tests.support.pipeline_harness import CLI, run_cli, table_rows, write_config

T0 = (int(time.time()) // 60 - 10) * 60_000  # recent: the broker's retention goes by record timestamps
T1 = T0 + 10_000  # the seat change: one source transaction, so -U and +U share this time
OLD, NEW = {"passenger": "ann", "seat": "1A"}, {"passenger": "ann", "seat": "2B"}
SEATS = {"from_changelog": {"preset": "flat"}, "primary_key": ["passenger"], "upsert_key": ["passenger", "seat"]}


def _produce(bootstrap: str, records: list[tuple[str, int, str, dict, int]]) -> None:
    """(topic, partition, op, row, timestamp) as flat op-coded JSON records; waits for every ack."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for topic, partition, op, row, timestamp in records:
        producer.produce(topic, key=json.dumps({"passenger": row["passenger"]}).encode(),
                         value=json.dumps({"op": op, **row}).encode(), partition=partition, timestamp=timestamp)
    assert producer.flush(60) == 0


def _movers(topic: str, at: int) -> list[tuple[str, int, str, dict, int]]:
    """Later changes of other passengers on both partitions: they move the event-time watermark."""
    return [(topic, p, "INSERT", {"passenger": f"mover{p}", "seat": f"{at}"}, at) for p in (0, 1)]


def _phases(topic: str) -> list[list[tuple[str, int, str, dict, int]]]:
    """One CLI run (so at least one micro-batch) per phase: +I (p0); the +U to a new seat (p1); the
    -U (p0) with later changes on both partitions, so the watermark passes the seat change."""
    return [[(topic, 0, "INSERT", OLD, T0)], [(topic, 1, "UPDATE_AFTER", NEW, T1)],
            [(topic, 0, "UPDATE_BEFORE", OLD, T1), *_movers(topic, T1 + 60_000)]]


@pytest.mark.slow
def test_seat_change_split_over_micro_batches_keeps_the_passenger_under_the_default_compaction(
    kafka_bootstrap, unique, workdir
):
    # No `compaction` and no `watermark_delay_seconds`: a retract source's defaults (watermark, 5 s).
    pipelines = [{"name": f"seats_{policy}", "topics": [f"seats.{policy}.{unique}"], "table": f"seats_{policy}",
                  "on_conflict": policy, **SEATS} for policy in ("nothing", "error")]
    create_topics(kafka_bootstrap, [p["topics"][0] for p in pipelines], 2)
    config = write_config(workdir / "config.yaml", kafka_bootstrap, workdir, pipelines)
    for phase in range(3):
        _produce(kafka_bootstrap, [r for p in pipelines for r in _phases(p["topics"][0])[phase]])
        result = run_cli(config, "--until-idle")
        assert result.returncode == 0, result.stderr[-4000:]
    for pipeline in pipelines:
        rows = table_rows(workdir / "tables" / pipeline["table"], "passenger")
        assert [row for row in rows if row["passenger"] == "ann"] == [NEW], (pipeline["name"], rows)


@pytest.mark.parametrize("policy", ["nothing", "error"])
def test_validate_refuses_batch_compaction_with_nothing_or_error_on_a_retract_source(tmp_path, policy):
    pipeline = {"name": "seats", "topics": ["seats"], "table": "seats", "on_conflict": policy,
                "compaction": "batch", **SEATS}
    config = write_config(tmp_path / "config.yaml", "127.0.0.1:1", tmp_path, [pipeline])
    result = subprocess.run([CLI, "validate", str(config)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert f"`compaction: batch` with `on_conflict: {policy}` is refused for a retract source" in result.stderr
    assert "Remove `compaction` (the default for this source is `watermark`" in result.stderr
    assert "`on_conflict: deduplicate`" in result.stderr
    allowed = write_config(tmp_path / "ok.yaml", "127.0.0.1:1", tmp_path, [{**pipeline, "compaction": "watermark"}])
    assert subprocess.run([CLI, "validate", str(allowed)], capture_output=True, text=True, timeout=120).returncode == 0
