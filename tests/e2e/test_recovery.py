"""The running service rides through a broker crash: Apache Kafka is SIGKILLed under it, the
failed pipeline restarts from its checkpoint after a backoff while the broker is away, and once
the broker is back (restarted on the same log directory) the table ends exactly equal to the replay."""

from __future__ import annotations

import signal

import pytest

from connectors.kafka.apache_broker import ApacheKafkaBroker
from service.operations.workload import DebeziumWorkload, create_topics, produce
from tests.support.pipeline_harness import start_cli, table_rows, wait_for_table, write_config

pytestmark = pytest.mark.slow
RESTARTED = "restart 1 of 30"


def test_broker_sigkill_is_survived(tmp_path, unique):
    # Its own broker (not the session one): this test kills and restarts it.
    broker = ApacheKafkaBroker(tmp_path / "broker").start()
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
        broker.kill()
        # Down until the pipeline has failed on it (the source's 15 s metadata timeout) and restarted.
        wait_for_table(uri, lambda: RESTARTED in log.read_text(), process, log)
        broker.start()
        produce(broker.bootstrap_servers, [e for key in range(200) for e in workload.next_events(key)])
        wait_for_table(uri, lambda: table_rows(uri) == workload.expected_rows(), process, log)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0, log.read_text()[-3000:]
        assert "interrupted" in log.read_text()
    finally:
        broker.kill()
