"""A real change capture end to end: PostgreSQL -> the Debezium engine -> Kafka -> `cdc-lakehouse run
--until-idle` -> Delta; every Delta table equals `SELECT *` of its source table, column for column.

The capture runs once per module (fixture `captured`): tables and snapshot rows, the engine
started and streaming, the mixed workload (tests/support/capture/workload.py), a marker row last, the
engine stopped once it captured the marker, then one pipeline per table and one `--until-idle`
run. The checks, the pipelines and the comparison with `SELECT *` are tests/support/capture/checks.py's
(shared with the Kafka Connect capture, test_connect_capture.py).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from service.operations.workload import create_topics
from tests.support.capture.checks import (
    Capture,
    ingest,
    phase,
    run_sql,
    test_capture_holds_every_case_of_the_workload,
    test_delta_column_types_follow_postgres,
    test_delta_table_equals_select_star,
    test_the_truncate_deletes_rows_stored_by_earlier_batches,
)
from tests.support.capture.debezium_engine import EngineProcess, debezium_properties
from tests.support.capture.postgres import (
    PostgresCluster,
    postgres,
)  # noqa: F401 - the session fixture
from tests.support.capture.workload import MARKER_RECORDS, MARKER_TABLE, SCHEMA, TABLES, Workload

pytestmark = pytest.mark.slow


def _capture(cluster: PostgresCluster, bootstrap: str, workdir: Path, timings: dict) -> Capture:
    unique = uuid.uuid4().hex[:8]
    dbname, prefix = f"rc_{unique}", f"rc{unique}"
    topics = {t.name: f"{prefix}.{SCHEMA}.{t.name}" for t in TABLES}
    workload, started = Workload(seed=11), time.monotonic()
    cluster.execute(f"CREATE DATABASE {dbname}", dbname="postgres")
    run_sql(cluster, workdir, "snapshot", workload.schema_sql() + "\n" + workload.snapshot_sql(), dbname)
    create_topics(bootstrap, topics.values(), 1)  # one partition: keyless rows have no key to route by
    started = phase(timings, "tables and snapshot rows", started)
    properties = debezium_properties(name=f"rc_{unique}", port=cluster.port, dbname=dbname, prefix=prefix,
                                     tables=[f"{SCHEMA}.{t.name}" for t in TABLES], workdir=workdir)
    engine = EngineProcess(properties, bootstrap, workdir, topics[MARKER_TABLE], MARKER_RECORDS).start()
    try:
        engine.wait_streaming()
        started = phase(timings, "engine start to streaming", started)
        run_sql(cluster, workdir, "streaming", workload.streaming_sql(), dbname)
        run_sql(cluster, workdir, "marker", workload.marker_sql(), dbname)
        started = phase(timings, "streaming workload (SQL)", started)
        produced = engine.wait_captured()
        phase(timings, "capture drained, engine stopped", started)
    finally:
        engine.stop()
        cluster.drop_replication_slot(properties["slot.name"])
    return Capture(dbname, topics, produced, workdir / "tables", timings)


@pytest.fixture(scope="module")
def captured(postgres: PostgresCluster, kafka_bootstrap: str, tmp_path_factory) -> Capture:  # noqa: F811
    """The whole capture and one `--until-idle` ingest of it."""
    workdir = tmp_path_factory.mktemp("real_capture")
    capture = _capture(postgres, kafka_bootstrap, workdir, {})
    ingest(capture, kafka_bootstrap, workdir)
    return capture
