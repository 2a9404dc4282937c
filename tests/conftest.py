"""Shared fixtures: one broker and one Spark session per test run; unique names per test.

Broker choice: KAFKA_BOOTSTRAP set -> that broker; else a Docker engine that answers ->
Apache Kafka through testcontainers; else Apache Kafka from the Maven jar cache
(`connectors.kafka.apache_broker`), one KRaft node on free ports, started once per run.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from connectors.maven_jars import KAFKA_VERSION
from tests.support.registry.apicurio import apicurio_registry_url

KAFKA_IMAGE = f"apache/kafka:{KAFKA_VERSION}"


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:  # noqa: BLE001 - any failure means "no usable engine"
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> str:
    """host:port of a Kafka-protocol broker for the whole run."""
    if os.environ.get("KAFKA_BOOTSTRAP"):
        yield os.environ["KAFKA_BOOTSTRAP"]
        return
    if _docker_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer(KAFKA_IMAGE).with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    from connectors.kafka.apache_broker import ApacheKafkaBroker

    with ApacheKafkaBroker(tmp_path_factory.mktemp("broker")) as broker:
        yield broker.bootstrap_servers


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession of the test run, able to run both Delta engines: the Delta jars of the
    cache (connectors/maven_jars.py) with Delta's SQL extension and catalog. Without the jars in the
    cache every test that needs Spark fails, naming the command that resolves them."""
    from connectors.maven_jars import JarsUnavailable, lib_jars
    from service.config.settings import SparkSettings
    from service.runtime.spark_session import build_spark

    try:
        lib_jars("delta")
    except JarsUnavailable as missing:
        pytest.fail(f"the test run's Spark session needs the Delta jars: {missing}", pytrace=False)
    session = build_spark(SparkSettings(master="local[2]", shuffle_partitions=2), engine="delta-spark")
    yield session
    session.stop()


@pytest.fixture
def unique() -> str:
    """A short unique suffix for topics, tables and checkpoints of one test."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A fresh directory for one test's tables and checkpoints."""
    return tmp_path
