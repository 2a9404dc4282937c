"""Apache Kafka from the Maven cache: the suite's broker is the real one, and it keeps what it acknowledged.

The session broker (fixture `kafka_bootstrap`) must be Apache Kafka, not an imitation: the
broker's own configuration answers a DescribeConfigs with KRaft settings only Apache Kafka has.
A broker of this test's own is SIGKILLed and restarted on the same log directory: every record
it acknowledged (acks=all) is still there, in order (noida-db lost writes acknowledged shortly
before its restart).
"""

from __future__ import annotations

import os
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from connectors.kafka.apache_broker import ApacheKafkaBroker
from connectors.maven_jars import KAFKA_VERSION

RECORDS = 2_000


def _broker_config(bootstrap: str) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    broker_id = next(iter(admin.list_topics(timeout=30).brokers))
    resource = ConfigResource(ConfigResource.Type.BROKER, str(broker_id))
    entries = admin.describe_configs([resource])[resource].result(timeout=30)
    return {name: entry.value for name, entry in entries.items()}


@pytest.mark.skipif(bool(os.environ.get("KAFKA_BOOTSTRAP")) and not os.environ.get("CDC_TEST_RUN_BROKER"),
                    reason="KAFKA_BOOTSTRAP chose another broker")
def test_the_suite_runs_on_apache_kafka(kafka_bootstrap):
    config = _broker_config(kafka_bootstrap)
    assert config["process.roles"] == "broker,controller"
    assert config["controller.listener.names"] == "CONTROLLER"
    assert KAFKA_VERSION.startswith("4.")


def _produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    failures: list[str] = []
    for i in range(count):
        producer.produce(topic, key=str(i).encode(), value=f"v{i}".encode(),
                         on_delivery=lambda error, _msg: failures.append(str(error)) if error else None)
    assert producer.flush(60) == 0
    assert failures == []


def _read_all(bootstrap: str, topic: str) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    try:
        while len(values) < RECORDS:
            message = consumer.poll(30)
            assert message is not None, f"only {len(values)} of {RECORDS} records came back"
            assert message.error() is None, message.error()
            values.append(message.value())
    finally:
        consumer.close()
    return values


def test_acknowledged_records_survive_a_broker_sigkill(tmp_path):
    broker = ApacheKafkaBroker(tmp_path / "broker").start()
    try:
        topic = f"durable-{uuid.uuid4().hex[:8]}"
        _produce(broker.bootstrap_servers, topic, RECORDS)
        first_port = broker.port
        broker.kill()
        broker.start()
        assert broker.port == first_port, "a restart keeps the broker's address"
        assert _read_all(broker.bootstrap_servers, topic) == [f"v{i}".encode() for i in range(RECORDS)]
    finally:
        broker.stop()
