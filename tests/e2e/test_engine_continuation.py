"""A table written by one Delta engine is continued by the other, both ways.

A pipeline ingests the first part of a Debezium stream with one engine; the same pipeline
(same checkpoint, same table) is then run with the other engine over the rest. The table ends
equal to the replay of the whole stream, read back with delta-rs and with Delta's own reader,
and its log shows commits of both engines.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from service.config.settings import settings_from_mapping
from service.operations.workload import DebeziumWorkload, create_topics, produce
from service.supervisor.runner import Runner
from tests.support.pipeline_harness import table_rows

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _run(bootstrap: str, workdir: Path, topic: str, engine: str) -> None:
    """The pipeline, in this process (the test session's Spark), until everything available is in the table."""
    runner = Runner(settings_from_mapping({
        "kafka": {"bootstrap_servers": bootstrap},
        "lakehouse": {"root": str(workdir / "tables"), "engine": engine},
        "checkpoint_root": str(workdir / "checkpoints"),
        "pipelines": [{"name": "p", "topics": [topic], "table": "t", "primary_key": ["id"],
                       "max_offsets_per_trigger": 300}],
    }))
    runner.start(until_idle=True)
    runner.wait()


def _writers(uri: Path) -> set[str]:
    """Which engines committed to the table: delta-rs writes `clientVersion` (the delta-rs engine's own
    small commits name themselves, connectors/delta/small_commit.py), Delta `engineInfo`."""
    found = set()
    for commit in DeltaTable(str(uri)).history():
        if str(commit.get("clientVersion", "")).startswith(("delta-rs", "cdc-lakehouse small commit")):
            found.add("delta-rs")
        if "Delta-Lake" in str(commit.get("engineInfo", "")):
            found.add("delta-spark")
    return found


@pytest.mark.parametrize(("first", "then"), [("delta-rs", "delta-spark"), ("delta-spark", "delta-rs")])
def test_a_table_one_engine_wrote_is_continued_by_the_other(spark, kafka_bootstrap, unique, workdir, first, then):
    workload = DebeziumWorkload(f"continue-{unique}", 2, "never", seed=9)
    create_topics(kafka_bootstrap, [workload.topic], 2)
    produce(kafka_bootstrap, workload.generate(600, 100))
    uri = workdir / "tables" / "t"
    _run(kafka_bootstrap, workdir, workload.topic, first)
    assert table_rows(uri) == workload.expected_rows() and _writers(uri) == {first}
    produce(kafka_bootstrap, [event for key in range(100) for event in workload.next_events(key)])

    _run(kafka_bootstrap, workdir, workload.topic, then)

    expected = workload.expected_rows()
    assert table_rows(uri) == expected  # delta-rs's reader
    assert [row.asDict() for row in spark.read.format("delta").load(str(uri)).orderBy("id").collect()] == expected
    assert _writers(uri) == {"delta-rs", "delta-spark"}
