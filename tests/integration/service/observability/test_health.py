"""/readyz follows the broker: ready while the pipeline runs, unready while the broker is stopped
(first a trigger hangs, then the pipeline fails and restarts), ready again once it is back;
/healthz stays up; the lag gauge follows the pipeline's progress.

The broker is Apache Kafka of the test's own, stopped gracefully (SIGTERM: a controlled shutdown)
and restarted on its log directory; a broker SIGKILL is tests/e2e/test_recovery.py's."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Callable

import pytest

from connectors.kafka.apache_broker import ApacheKafkaBroker
from connectors.kafka.local_broker import free_port
from service.config.settings import settings_from_mapping
from service.operations.workload import DebeziumWorkload, create_topics, produce
from service.supervisor.runner import Runner

pytestmark = pytest.mark.slow  # a broker outage: about a minute
EVENTS, PER_BATCH = 150, 50


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:  # the endpoint is not listening yet
        return 0, str(error)


def _until(condition: Callable[[], bool], what: str, timeout: float, runner_thread: threading.Thread) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        assert runner_thread.is_alive(), f"the runner stopped while waiting for: {what}"
        time.sleep(0.1)
    raise AssertionError(f"not reached in {timeout}s: {what}")


def _sample(base: str, metric: str, pipeline: str) -> float | None:
    prefix = f'{metric}{{pipeline="{pipeline}"}} '
    lines = [line for line in _get(f"{base}/metrics")[1].splitlines() if line.startswith(prefix)]
    return float(lines[0][len(prefix):]) if lines else None


def _lag(base: str, pipeline: str) -> float | None:
    return _sample(base, "cdc_pipeline_lag_records", pipeline)


def _restarting(base: str, pipeline: str) -> bool:
    """Unready while the failed pipeline restarts (it has restarted at least once)."""
    status, body = _get(f"{base}/readyz")
    restarts = _sample(base, "cdc_pipeline_restarts_total", pipeline) or 0
    return status == 503 and restarts >= 1 and json.loads(body)["pipelines"][pipeline]["ready"] is False


def test_readyz_turns_unready_while_the_broker_is_stopped(spark, tmp_path, unique):
    broker = ApacheKafkaBroker(tmp_path / "broker").start()  # its own: this test stops and restarts it
    workload = DebeziumWorkload(f"health-{unique}", 2, "never", seed=7)
    create_topics(broker.bootstrap_servers, [workload.topic], 2)
    events = workload.generate(EVENTS, 60)  # plus a tombstone after each delete
    produce(broker.bootstrap_servers, events)
    port, name = free_port(), f"h{unique}"
    runner = Runner(settings_from_mapping({
        "kafka": {"bootstrap_servers": broker.bootstrap_servers},
        "lakehouse": {"root": str(tmp_path / "tables")}, "checkpoint_root": str(tmp_path / "checkpoints"),
        "metrics_port": port, "metrics_address": "127.0.0.1", "trigger_interval_seconds": 1.0,
        "readiness_stale_triggers": 2,
        "recovery": {"max_attempts": 30, "initial_backoff_seconds": 0.5, "max_backoff_seconds": 2},
        "pipelines": [{"name": name, "topics": [workload.topic], "table": "t", "primary_key": ["id"],
                       "max_offsets_per_trigger": PER_BATCH}],
    }))
    failures: list[BaseException] = []

    def run() -> None:
        try:
            runner.start()
            runner.wait()
        except BaseException as error:  # noqa: BLE001 - reported by the test
            failures.append(error)

    thread = threading.Thread(target=run, name="runner", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        # One batch of PER_BATCH records per trigger (1 s): the lag is seen before it reaches 0.
        _until(lambda: (_lag(base, name) or 0) > 0, "a positive lag", 120, thread)
        assert _lag(base, name) <= len(events) - PER_BATCH
        _until(lambda: _get(f"{base}/readyz")[0] == 200 and _lag(base, name) == 0, "ready, caught up", 120, thread)

        broker.stop()
        # First its trigger hangs in offset planning (stale), then the query fails and restarts.
        _until(lambda: _get(f"{base}/readyz")[0] == 503, "unready without the broker", 120, thread)
        _until(lambda: _restarting(base, name), "unready, restarting after the failure", 120, thread)
        assert _get(f"{base}/healthz")[0] == 200, "alive while unready"

        broker.start()
        _until(lambda: _get(f"{base}/readyz")[0] == 200, "ready again with the broker back", 180, thread)
        assert json.loads(_get(f"{base}/readyz")[1]) == {"ready": True, "pipelines": {name: {"ready": True,
                                                                                             "reason": None}}}
    finally:
        runner.stop_requested.set()
        thread.join(timeout=180)
        if runner.endpoint is not None:
            runner.endpoint.shutdown()
            runner.endpoint.server_close()
        broker.stop()
    assert not thread.is_alive() and not failures, failures
