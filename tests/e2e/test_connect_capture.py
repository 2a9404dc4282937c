"""Debezium as users deploy it, end to end: PostgreSQL -> a Kafka Connect worker (distributed mode)
running the Debezium PostgreSQL connector plugin -> Kafka -> `cdc-lakehouse run --until-idle` ->
Delta; every Delta table equals `SELECT *` of its source table, column for column.

The worker and the plugin are the Maven Central jars of the `connect` component
(tests/support/capture/connect_worker.py): Kafka Connect 4.3.0, the Kafka Debezium 3.6.3 is built against,
with the broker of the test session (Apache Kafka 4.4). Debezium 3.6.3 does not run on a 4.4 worker:
its task fails at start with NoClassDefFoundError org/apache/kafka/common/utils/Sanitizer (Kafka 4.4
moved that class to common.utils.internals; see `CONNECT_VERSION` in connectors/maven_jars.py).
The connector is registered by POSTing the JSON that the compose stack registers, read from
deploy/debezium/postgres-inventory.json, with only `overrides` changed and `REMOVED` left out
(each says why).

The capture runs once per module (fixture `captured`): tables and snapshot rows; the worker started;
the connector POSTed and RUNNING with its task; the snapshot counted on the topics; the mixed
workload of tests/support/capture/workload.py (updates, deletes, primary-key changes, a TRUNCATE, TOAST
values, a keyless table) and a marker row last; the marker counted on its topic, then the worker's
committed source offset at or past the marker's LSN (Connect commits a record's offset only after
Kafka acknowledged it and everything the task produced before it: so every change is in Kafka).
Then one `--until-idle` run, and the checks of tests/support/capture/checks.py (shared with the embedded
engine's test_real_capture.py).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from service.operations.workload import create_topics
from tests.support.capture.checks import (
    Capture,
    ingest,
    phase,
    records,
    run_sql,
    test_capture_holds_every_case_of_the_workload,
    test_delta_column_types_follow_postgres,
    test_delta_table_equals_select_star,
    test_the_truncate_deletes_rows_stored_by_earlier_batches,
)
from tests.support.capture.connect_worker import ConnectWorker
from tests.support.capture.debezium_engine import DEPLOYED_CONNECTOR
from tests.support.capture.postgres import (
    PostgresCluster,
    postgres,
)  # noqa: F401 - the session fixture
from tests.support.capture.workload import (
    MARKER_RECORDS,
    MARKER_TABLE,
    SCHEMA,
    SNAPSHOT_ROWS,
    TABLES,
    Workload,
)

pytestmark = pytest.mark.slow
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
# Left out of the deployed config: settings of Confluent's Avro converter (io.confluent artifacts
# are not on Maven Central, and there is no registry here).
REMOVED = ("key.converter.schema.registry.url", "value.converter.schema.registry.url")
SNAPSHOT_TIMEOUT_S = 180.0
CAPTURE_TIMEOUT_S = 300.0


def overrides(cluster: PostgresCluster, dbname: str, prefix: str) -> dict[str, str]:
    """The keys of the deployed connector that must differ on this machine; every other key of
    deploy/debezium/postgres-inventory.json is POSTed as it is (connector class, tasks.max, pgoutput,
    filtered publication, slot name, initial snapshot, tombstones, no skipped operations; user and
    password too: the test cluster trusts its superuser `postgres`)."""
    return {
        "database.hostname": "127.0.0.1",  # compose: the `postgres` service; here the private cluster
        "database.port": str(cluster.port),  # a free port, not 5432 (one cluster per test session)
        "database.dbname": dbname,  # a fresh database per run, not the example image's `postgres`
        "topic.prefix": prefix,  # unique per run: the broker is shared by the whole test session
        # The workload's tables, not the Debezium example image's inventory schema (not here).
        "table.include.list": ",".join(f"{SCHEMA}.{t.name}" for t in TABLES),
        # Kafka Connect's JSON converter with schemas instead of Confluent's Avro converter.
        "key.converter": JSON_CONVERTER, "key.converter.schemas.enable": "true",
        "value.converter": JSON_CONVERTER, "value.converter.schemas.enable": "true",
    }


def connector_json(cluster: PostgresCluster, dbname: str, prefix: str) -> dict:
    """The deployed connector's JSON (name and config) with `overrides` and without `REMOVED`."""
    deployed = json.loads(DEPLOYED_CONNECTOR.read_text())
    config = {k: v for k, v in deployed["config"].items() if k not in REMOVED}
    return {"name": deployed["name"], "config": {**config, **overrides(cluster, dbname, prefix)}}


@dataclass
class ConnectCapture(Capture):
    """A capture through Kafka Connect, with what the worker said about it."""

    posted: dict = field(default_factory=dict)  # the connector JSON POSTed
    running_config: dict = field(default_factory=dict)  # GET /connectors/<name>/config afterwards
    worker: dict = field(default_factory=dict)  # start-up seconds, RSS


def _counts(bootstrap: str, topics: list[str]) -> dict[str, int]:
    """Records on each (one-partition) topic."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"cc-{uuid.uuid4().hex}"})
    try:
        return {topic: consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1] for topic in topics}
    finally:
        consumer.close()


def _offset_covers(worker: ConnectWorker, name: str, lsn: int) -> bool:
    """Whether the connector's committed source offset is at or past `lsn`."""
    return any(entry["offset"].get("lsn", -1) >= lsn for entry in worker.source_offsets(name))


def _stream_and_drain(worker: ConnectWorker, cluster: PostgresCluster, workdir: Path, capture: ConnectCapture,
                      workload: Workload, bootstrap: str) -> None:
    """Snapshot counted, workload and marker run, every change acknowledged by Kafka."""
    name, topics, timings = capture.posted["name"], capture.topics, capture.timings
    started = time.monotonic()
    snapshot = {topics[t]: n for t, n in {**SNAPSHOT_ROWS, MARKER_TABLE: MARKER_RECORDS - 1}.items()}
    worker.wait_for(lambda: _counts(bootstrap, list(snapshot)) == snapshot, f"snapshot {snapshot}",
                    SNAPSHOT_TIMEOUT_S)
    started = phase(timings, "snapshot on the topics", started)
    run_sql(cluster, workdir, "streaming", workload.streaming_sql(), capture.dbname)
    run_sql(cluster, workdir, "marker", workload.marker_sql(), capture.dbname)
    started = phase(timings, "streaming workload (SQL)", started)
    marker_topic = topics[MARKER_TABLE]
    worker.wait_for(lambda: _counts(bootstrap, [marker_topic])[marker_topic] == MARKER_RECORDS, "marker on its topic",
                    CAPTURE_TIMEOUT_S)
    marker_lsn = records(bootstrap, marker_topic)[-1][1]["source"]["lsn"]
    worker.wait_for(lambda: _offset_covers(worker, name, marker_lsn), f"offset committed up to LSN {marker_lsn}",
                    CAPTURE_TIMEOUT_S)
    phase(timings, "capture drained (offset committed past the marker)", started)


def _capture(cluster: PostgresCluster, bootstrap: str, workdir: Path) -> ConnectCapture:
    unique = uuid.uuid4().hex[:8]
    dbname, prefix = f"cc_{unique}", f"cc{unique}"
    topics = {t.name: f"{prefix}.{SCHEMA}.{t.name}" for t in TABLES}
    capture = ConnectCapture(dbname, topics, {}, workdir / "tables", posted=connector_json(cluster, dbname, prefix))
    workload, started = Workload(seed=13), time.monotonic()
    cluster.execute(f"CREATE DATABASE {dbname}", dbname="postgres")
    run_sql(cluster, workdir, "snapshot", workload.schema_sql() + "\n" + workload.snapshot_sql(), dbname)
    create_topics(bootstrap, topics.values(), 1)  # one partition: keyless rows have no key to route by
    started = phase(capture.timings, "tables and snapshot rows", started)
    worker = ConnectWorker(workdir / "connect", bootstrap)
    try:
        worker.start()
        started = phase(capture.timings, "worker start to ready", started)
        name = capture.posted["name"]
        worker.create_connector(capture.posted)
        worker.wait_running(name)
        started = phase(capture.timings, "connector POSTed to RUNNING", started)
        _stream_and_drain(worker, cluster, workdir, capture, workload, bootstrap)
        capture.running_config = worker.request("GET", f"/connectors/{name}/config")
        capture.produced = _counts(bootstrap, list(topics.values()))
        capture.worker = {"start-up s": round(worker.startup_seconds, 1),
                          "RSS MiB": worker.rss_bytes() >> 20, "peak RSS MiB": worker.rss_bytes(peak=True) >> 20}
        print(f"Kafka Connect worker: {capture.worker}")
    finally:
        worker.stop()
        cluster.drop_replication_slot(capture.posted["config"]["slot.name"])
    return capture


@pytest.fixture(scope="module")
def captured(postgres: PostgresCluster, kafka_bootstrap: str, tmp_path_factory) -> ConnectCapture:  # noqa: F811
    """The whole capture through Kafka Connect and one `--until-idle` ingest of it."""
    workdir = tmp_path_factory.mktemp("connect_capture")
    capture = _capture(postgres, kafka_bootstrap, workdir)
    ingest(capture, kafka_bootstrap, workdir)
    return capture


def test_the_worker_runs_the_deployed_connector_with_only_the_overrides(captured: ConnectCapture):
    deployed = json.loads(DEPLOYED_CONNECTOR.read_text())
    running = dict(captured.running_config)  # as Kafka Connect stored it
    assert running.pop("name") == deployed["name"]
    differing = {k for k in running.keys() | deployed["config"].keys() if running.get(k) != deployed["config"].get(k)}
    assert differing == {*REMOVED, "database.hostname", "database.port", "database.dbname", "topic.prefix",
                         "table.include.list", "key.converter", "key.converter.schemas.enable", "value.converter",
                         "value.converter.schemas.enable"}
