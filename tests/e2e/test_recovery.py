"""The running service rides through a broker outage: the failed pipeline restarts from its
checkpoint after a backoff and the table ends exactly equal to the replay."""

from __future__ import annotations

import signal
import time

import pytest

from connectors.kafka.local_broker import LocalBroker
from service.workload import DebeziumWorkload, create_topics, produce
from tests.pipeline_harness import start_cli, table_rows, wait_for_table, write_config

pytestmark = pytest.mark.slow
OUTAGE_S = 25  # longer than the source's 15 s metadata timeout: the query does fail


def test_broker_outage_is_survived(tmp_path, unique):
    # Its own broker (not the session one): this test stops and restarts it.
    broker = LocalBroker(tmp_path / "broker").start()
    try:
        workload = DebeziumWorkload(f"outage-{unique}", 2, "never", seed=5)
        create_topics(broker.bootstrap_servers, [workload.topic], 2)
        produce(broker.bootstrap_servers, workload.generate(1500, 200))
        config = write_config(
            tmp_path / "c.yaml", broker.bootstrap_servers, tmp_path,
            [{"name": "p", "topics": [workload.topic], "table": "t", "primary_key": ["id"]}],
            recovery={"max_attempts": 30, "initial_backoff_seconds": 1, "max_backoff_seconds": 4},
        )
        uri, log = tmp_path / "tables" / "t", tmp_path / "run.log"
        process = start_cli(config, log=log)
        wait_for_table(uri, lambda: table_rows(uri) == workload.expected_rows(), process, log)
        broker.stop()
        time.sleep(OUTAGE_S)
        broker.start()
        produce(broker.bootstrap_servers, [e for key in range(200) for e in workload.next_events(key)])
        wait_for_table(uri, lambda: table_rows(uri) == workload.expected_rows(), process, log)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0, log.read_text()[-3000:]
        assert "interrupted" in log.read_text() and "restart 1 of 30" in log.read_text()
    finally:
        broker.stop()
