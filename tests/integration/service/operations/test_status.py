"""`status` reports checkpoint batch, Delta batch, table version and lag per pipeline."""

from __future__ import annotations

import json
import subprocess

from service.config.settings import load_settings
from service.operations.workload import DebeziumWorkload, create_topics, produce
from service.supervisor.runner import Runner
from tests.support.pipeline_harness import CLI, write_config


def test_status_before_and_after_a_run(spark, kafka_bootstrap, unique, workdir):
    workload = DebeziumWorkload(f"status-{unique}", 3, "never", seed=2)
    create_topics(kafka_bootstrap, [workload.topic], 3)
    events = workload.generate(300, 40)
    produce(kafka_bootstrap, events)
    config = write_config(workdir / "c.yaml", kafka_bootstrap, workdir,
                          [{"name": "s", "topics": [workload.topic], "table": "t", "primary_key": ["id"]}])

    def status() -> dict:
        result = subprocess.run([CLI, "status", str(config), "--json"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        (only,) = json.loads(result.stdout)
        return only

    before = status()
    assert before["lag"] == len(events) and before["checkpoint_batch"] is None and before["table_version"] is None
    runner = Runner(load_settings(config))
    runner.start(until_idle=True)
    runner.wait()
    after = status()
    assert after["lag"] == 0 and after["checkpoint_batch"] == 0 and after["delta_batch"] == 0
    assert after["table_version"] == 1 and after["committed_offsets"] == after["end_offsets"]
    more = workload.next_events(0)
    produce(kafka_bootstrap, more)
    assert status()["lag"] == len(more)


def test_status_shows_exports_with_their_lag_in_versions(spark, kafka_bootstrap, unique, workdir):
    workload = DebeziumWorkload(f"status-export-{unique}", 2, "never", seed=4)
    create_topics(kafka_bootstrap, [workload.topic], 2)
    produce(kafka_bootstrap, workload.generate(200, 30))
    export = {"name": f"x{unique}", "table": "t", "topic": f"status-out-{unique}", "primary_key": ["id"],
              "preset": "debezium"}
    config = write_config(workdir / "c.yaml", kafka_bootstrap, workdir,
                          [{"name": "s", "topics": [workload.topic], "table": "t", "primary_key": ["id"]}],
                          exports=[export])

    def export_status() -> dict:
        result = subprocess.run([CLI, "status", str(config), "--json"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        (found,) = [item for item in json.loads(result.stdout) if item["kind"] == "export"]
        return found

    before = export_status()
    assert before["export"] == export["name"] and before["table_version"] is None and before["lag"] == 0
    assert before["published_version"] is None and before["checkpoint_batch"] is None
    settings = load_settings(config)
    runner = Runner(settings)
    runner.start(until_idle=True)
    runner.wait()
    after = export_status()
    assert after["table_version"] == after["published_version"] == after["checkpoint_version"] == 1
    assert after["lag"] == 0 and after["checkpoint_batch"] is not None
    produce(kafka_bootstrap, workload.next_events(0))
    ingest_only = Runner(settings.model_copy(update={"exports": ()}))
    ingest_only.start(until_idle=True)
    ingest_only.wait()
    behind = export_status()
    assert behind["table_version"] == 2 and behind["published_version"] == 1 and behind["lag"] == 1
    text = subprocess.run([CLI, "status", str(config)], capture_output=True, text=True, timeout=120).stdout
    assert f"{export['name']}" in text and f"-> {export['topic']}" in text
