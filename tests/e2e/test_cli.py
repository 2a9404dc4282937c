"""The command line as a user runs it: validate, run until SIGTERM, demo."""

from __future__ import annotations

import signal
import subprocess

import pytest

from service.config.sources import BATCH_MARKER_ENV
from service.operations.workload import DebeziumWorkload, create_topics, produce
from service.runtime.test_hooks import ARM_SUFFIX
from tests.support.pipeline_harness import (
    CLI,
    start_cli,
    table_rows,
    table_version,
    wait_for_table,
    write_config,
)

PIPELINE = {"name": "p", "topics": ["t"], "table": "t", "primary_key": ["id"]}


def test_validate_accepts_good_and_names_bad_keys(tmp_path):
    good = write_config(tmp_path / "good.yaml", "127.0.0.1:1", tmp_path, [PIPELINE])
    result = subprocess.run([CLI, "validate", str(good)], capture_output=True, text=True)
    assert result.returncode == 0 and "1 pipeline(s)" in result.stdout
    bad = write_config(tmp_path / "bad.yaml", "127.0.0.1:1", tmp_path, [{**PIPELINE, "primry_key": ["id"]}])
    result = subprocess.run([CLI, "validate", str(bad)], capture_output=True, text=True)
    assert result.returncode == 1
    assert str(bad) in result.stderr and "pipelines.0.primry_key: unknown key" in result.stderr


@pytest.mark.slow
def test_run_stops_gracefully_on_sigterm_and_resumes(kafka_bootstrap, unique, workdir, monkeypatch):
    workload = DebeziumWorkload(f"graceful-{unique}", 2, "never", seed=3)
    create_topics(kafka_bootstrap, [workload.topic], 2)
    produce(kafka_bootstrap, workload.generate(3000, 300))
    config = write_config(workdir / "c.yaml", kafka_bootstrap, workdir,
                          [{**PIPELINE, "topics": [workload.topic], "max_offsets_per_trigger": 500}])
    uri, marker = workdir / "tables" / "t", workdir / "batch.marker"
    monkeypatch.setenv(BATCH_MARKER_ENV, str(marker))
    process = start_cli(config, log=workdir / "run.log")
    wait_for_table(uri, lambda: table_rows(uri) == workload.expected_rows(), process, workdir / "run.log")
    versions_before = table_version(uri)
    produce(kafka_bootstrap, [e for key in range(300) for e in workload.next_events(key)])
    # The running service picks up new data.
    wait_for_table(uri, lambda: table_rows(uri) == workload.expected_rows(), process, workdir / "run.log")
    assert table_version(uri) > versions_before
    # The test hook holds the next micro-batch open, so the SIGTERM lands inside it.
    marker.with_name(marker.name + ARM_SUFFIX).touch()
    produce(kafka_bootstrap, [e for key in range(300) for e in workload.next_events(key)])
    wait_for_table(uri, marker.exists, process, workdir / "run.log")
    held = marker.read_text().split()
    process.send_signal(signal.SIGTERM)
    marker.unlink()  # release the batch: the service lets it finish, then stops
    assert process.wait(timeout=120) == 0, (workdir / "run.log").read_text()[-3000:]
    assert f"pipeline {held[0]}: batch {held[1]} -> " in (workdir / "run.log").read_text()
    rerun = subprocess.run([CLI, "run", str(config), "--until-idle"], capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert table_rows(uri) == workload.expected_rows()


@pytest.mark.slow
def test_demo_runs_on_embedded_defaults(tmp_path):
    result = subprocess.run([CLI, "demo", "--output", str(tmp_path / "demo"), "--events", "1500"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "table equals the replay of the events" in result.stdout
    assert f"table: {tmp_path / 'demo' / 'tables' / 'customers'}" in result.stdout
