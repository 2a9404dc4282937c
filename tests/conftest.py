"""Shared fixtures: one broker and one Spark session per test run; unique names per test.

Broker choice: KAFKA_BOOTSTRAP set -> that broker; else a Docker engine that answers ->
Apache Kafka through testcontainers; else Apache Kafka from the Maven jar cache
(`connectors.kafka.apache_broker`), one KRaft node on free ports, started once per run.

With pytest-xdist workers (`scripts/test.sh` runs two), the controller starts that broker and
hands it to every worker as KAFKA_BOOTSTRAP, and every module with a test that needs the Spark
session runs on one worker (the scheduler below), so the run still has one broker and one session.
Other modules go whole to whichever worker is free (a module fixture is built once). Each worker
starts the registry and PostgreSQL for itself if its modules need them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from connectors.maven_jars import KAFKA_VERSION
from tests.support import module_durations, run_seed
from tests.support.registry.apicurio import (
    apicurio_registry_url,  # noqa: F401 - a fixture of the whole suite
)

KAFKA_IMAGE = f"apache/kafka:{KAFKA_VERSION}"


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:  # noqa: BLE001 - any failure means "no usable engine"
        return False


@contextlib.contextmanager
def _broker(directory: Path) -> Iterator[str]:
    """host:port of a broker started here for the run: testcontainers where Docker answers, else
    Apache Kafka from the jar cache with its logs under `directory`."""
    if _docker_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer(KAFKA_IMAGE).with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    from connectors.kafka.apache_broker import ApacheKafkaBroker

    with ApacheKafkaBroker(directory) as broker:
        yield broker.bootstrap_servers


_RUN_BROKER = pytest.StashKey[contextlib.ExitStack]()
_SPARK_MODULES_ENV = "CDC_TEST_SPARK_MODULES"  # where the workers name the modules that need the Spark session


def _controls_workers(config: pytest.Config) -> bool:
    """This process is the xdist controller of worker processes (not a worker, not a plain run)."""
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    """The run's random seed, chosen before any worker starts; under xdist, the controller also
    starts the run's one broker before the workers start."""
    run_seed.choose()
    if not _controls_workers(config):
        return
    os.environ[_SPARK_MODULES_ENV] = str(Path(tempfile.mkdtemp(prefix="cdc-test-groups-")) / "spark_modules.json")
    if os.environ.get("KAFKA_BOOTSTRAP"):
        return
    stack = contextlib.ExitStack()
    directory = Path(tempfile.mkdtemp(prefix="cdc-test-broker-"))
    stack.callback(shutil.rmtree, directory, ignore_errors=True)  # after the broker stops (the stack unwinds)
    os.environ["KAFKA_BOOTSTRAP"] = stack.enter_context(_broker(directory))
    os.environ["CDC_TEST_RUN_BROKER"] = "1"  # the broker is the run's own, not one the user chose
    config.stash[_RUN_BROKER] = stack


def pytest_report_header(config: pytest.Config) -> str:
    return f"run seed: {run_seed.choose()} (replay with {run_seed.ENV}=<seed>)"


def pytest_unconfigure(config: pytest.Config) -> None:
    stack = config.stash.get(_RUN_BROKER, None)
    if stack is not None:
        stack.close()
        os.environ.pop("KAFKA_BOOTSTRAP", None)
        os.environ.pop("CDC_TEST_RUN_BROKER", None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: tell the controller's scheduler which modules need the Spark session."""
    if hasattr(config, "workerinput") and os.environ.get(_SPARK_MODULES_ENV):
        modules = sorted({item.nodeid.split("::")[0] for item in items if "spark" in getattr(item, "fixturenames", ())})
        target = Path(os.environ[_SPARK_MODULES_ENV])
        partial = target.with_name(f"{target.name}.{os.getpid()}")
        partial.write_text(json.dumps(modules))
        os.replace(partial, target)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Whole modules to whichever worker is free, longest first (`tests/support/module_durations.py`),
    and every module that needs the Spark session to one worker, as one unit."""
    from xdist.scheduler import LoadScopeScheduling

    class SparkModulesOnOneWorker(LoadScopeScheduling):
        spark_modules: frozenset[str] | None = None
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            if self.spark_modules is None:  # the workers wrote it before they reported their collection
                self.spark_modules = frozenset(json.loads(Path(os.environ[_SPARK_MODULES_ENV]).read_text()))
            module = nodeid.split("::")[0]
            return "spark" if module in self.spark_modules else module

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the first call: the work queue is complete, nothing handed out yet
                self.ordered = True
                order = module_durations.longest_first(self.workqueue, {"spark": self.spark_modules or frozenset()})
                for scope in order:
                    self.workqueue.move_to_end(scope)
            super()._assign_work_unit(node)

    return SparkModulesOnOneWorker(config, log)



@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a Kafka-protocol broker for the whole run."""
    if os.environ.get("KAFKA_BOOTSTRAP"):
        yield os.environ["KAFKA_BOOTSTRAP"]
        return
    with _broker(tmp_path_factory.mktemp("broker")) as bootstrap:
        try:
            yield bootstrap
        finally:
            from connectors.kafka.range_reader import IDLE_CONSUMERS

            IDLE_CONSUMERS.close()  # the readers' kept consumers would try to reconnect until the process exits


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """The one SparkSession of the test run, able to run both Delta engines: the Delta jars of the
    cache (connectors/maven_jars.py) with Delta's SQL extension and catalog. Without the jars in the
    cache every test that needs Spark fails, naming the command that resolves them. The tests'
    checkpoints are local (under the run's temporary root), as the service's are by default."""
    from connectors.maven_jars import JarsUnavailable, lib_jars
    from service.config.settings import SparkSettings
    from service.runtime.spark_session import build_spark

    try:
        lib_jars("delta")
    except JarsUnavailable as missing:
        pytest.fail(f"the test run's Spark session needs the Delta jars: {missing}", pytrace=False)
    session = build_spark(SparkSettings(master="local[2]", shuffle_partitions=2), engine="delta-spark",
                          checkpoint_root=str(tmp_path_factory.getbasetemp()))
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
