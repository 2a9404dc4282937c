"""Readiness rules, lag from a query's progress, the HTTP endpoints and JSON log lines (no Spark, no broker)."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import pytest

from connectors.kafka.local_broker import free_port
from service.observability import health, metrics
from service.observability.http_endpoints import serve_endpoints
from service.observability.log_format import JsonLinesFormatter, message_fields
from vocabulary.errors import SourceCoordinates

# Sources of real progress reports (pyspark 4.2, our Kafka source and change-feed source).
INGEST_SOURCE = {
    "startOffset": '{"t": {"0": 47, "1": 53}, "$event_time": {"at": 1, "partitions": {}}}',
    "endOffset": '{"t": {"0": 95, "1": 105}, "$event_time": {"at": 2, "partitions": {}}}',
    "latestOffset": '{"t": {"0": 143, "1": 157}}',
}
EXPORT_SOURCE = {"startOffset": '{"version": 3}', "endOffset": '{"version": 4}', "latestOffset": '{"version": 9}'}
T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def _progress(sources: list[dict], timestamp: str = "2027-01-15T08:00:00.000Z", duration_ms: int = 500) -> dict:
    return {"timestamp": timestamp, "durationMs": {"triggerExecution": duration_ms}, "sources": sources}


@dataclass
class FakeQuery:
    isActive: bool = True  # noqa: N815 - Spark's name
    status: dict = field(default_factory=lambda: {"isTriggerActive": False})
    lastProgress: dict | None = field(default_factory=lambda: _progress([INGEST_SOURCE]))  # noqa: N815


def _health(query, **kwargs):
    options = {"restarting": False, "finished": False, "max_age_s": 15.0, "now": T0 + 1}
    return health.query_health("p", query, **{**options, **kwargs})


def test_ready_only_when_started_active_and_a_trigger_completed():
    assert _health(FakeQuery()) == health.PipelineHealth("p", True)
    assert _health(None).reason == "query not started"
    assert _health(FakeQuery(), restarting=True).reason == "restarting after a transient failure"
    assert _health(FakeQuery(), finished=True).reason == "query finished"
    assert _health(FakeQuery(isActive=False)).reason == "query stopped"
    assert _health(FakeQuery(lastProgress=None)).reason == "no trigger completed yet"


def test_a_commit_failed_behind_the_query_turns_it_unready_at_once():
    failed = _health(FakeQuery(), failed_commit=OSError("disk full"))
    assert not failed.ready and failed.reason.endswith("failed behind the query (raised with its next batch): "
                                                       "OSError: disk full")
    assert _health(FakeQuery(), restarting=True, failed_commit=OSError("x")).reason.startswith("restarting")


def test_a_running_trigger_turns_unready_once_its_last_progress_is_too_old():
    running = FakeQuery(status={"isTriggerActive": True})
    assert _health(running, now=T0 + 15.5).ready  # the progress ended at T0 + 0.5
    late = _health(running, now=T0 + 16)
    assert not late.ready and "last progress 16s ago (limit 15s)" in late.reason
    assert _health(FakeQuery(), now=T0 + 3600).ready, "a query waiting for its next trigger is alive"
    assert health.max_progress_age(30, 1.0, 10.0) == 40.0


def test_readiness_needs_every_pipeline():
    ready, unready = health.PipelineHealth("a", True), health.PipelineHealth("b", False, "query stopped")
    assert health.Readiness((ready,)).ready and not health.Readiness((ready, unready)).ready
    assert not health.Readiness().ready, "no pipeline started yet is not ready"
    assert health.Readiness((ready, unready)).as_dict() == {
        "ready": False, "pipelines": {"a": {"ready": True, "reason": None}, "b": {"ready": False, "reason": "query stopped"}},
    }


def test_lag_from_the_last_progress():
    assert health.records_behind(_progress([INGEST_SOURCE])) == (143 - 95) + (157 - 105)
    assert health.versions_behind(_progress([EXPORT_SOURCE])) == 5
    assert health.records_behind(None) is None and health.versions_behind(None) is None
    first = {"startOffset": None, "endOffset": '{"t": {"0": 10}}', "latestOffset": None}
    assert health.records_behind(_progress([first])) == 0
    metrics.record_lag("lag-test", _progress([INGEST_SOURCE]), export=False)
    metrics.record_lag("lag-test", _progress([EXPORT_SOURCE]), export=True)
    assert metrics.LAG_RECORDS.labels("lag-test")._value.get() == 100
    assert metrics.LAG_VERSIONS.labels("lag-test")._value.get() == 5


def _get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read()


@pytest.fixture
def endpoints():
    answers = [health.Readiness((health.PipelineHealth("p", True),))]
    port = free_port()

    def readiness() -> health.Readiness:
        if isinstance(answers[-1], Exception):
            raise answers[-1]
        return answers[-1]

    server = serve_endpoints(port, "127.0.0.1", readiness)
    yield f"http://127.0.0.1:{port}", answers
    server.shutdown()
    server.server_close()


def test_endpoints_serve_metrics_liveness_and_readiness(endpoints):
    base, answers = endpoints
    metrics.LAG_RECORDS.labels("endpoint-test").set(7)
    code, content_type, body = _get(f"{base}/metrics")
    assert code == 200 and content_type.startswith("text/plain")
    assert 'cdc_pipeline_lag_records{pipeline="endpoint-test"} 7.0' in body.decode()
    assert _get(f"{base}/healthz")[0] == 200
    code, content_type, body = _get(f"{base}/readyz")
    assert (code, content_type, json.loads(body)["ready"]) == (200, "application/json", True)
    answers.append(health.Readiness((health.PipelineHealth("p", False, "restarting after a transient failure"),)))
    code, _, body = _get(f"{base}/readyz")
    assert code == 503 and json.loads(body)["pipelines"]["p"]["reason"] == "restarting after a transient failure"
    assert _get(f"{base}/healthz")[0] == 200, "alive while unready"
    assert _get(f"{base}/other")[0] == 404


def test_a_failing_readiness_check_answers_unready(endpoints):
    base, answers = endpoints
    answers.append(RuntimeError("py4j gateway gone"))
    code, _, body = _get(f"{base}/readyz")
    assert code == 503 and json.loads(body)["pipelines"]["(service)"]["reason"] == (
        "readiness check failed: py4j gateway gone"
    )
    assert _get(f"{base}/healthz")[0] == 200


def _json_line(message: str, *args, **extra) -> dict:
    record = logging.LogRecord("service.x", logging.INFO, __file__, 1, message, args, None)
    record.__dict__.update(extra)
    return json.loads(JsonLinesFormatter().format(record))


def test_json_log_lines_carry_one_field_per_item():
    where = SourceCoordinates("orders", 2, 41, key="k")
    line = _json_line("pipeline %s: batch %d: dropped a bad record at %s", "orders.v1", 12, where)
    assert line["pipeline"] == "orders.v1" and line["batch"] == 12
    assert (line["topic"], line["partition"], line["offset"]) == ("orders", 2, 41)
    assert line["level"] == "INFO" and line["logger"] == "service.x" and line["ts"].endswith("+00:00")
    assert _json_line("export e1: batch 3 -> out: versions to 7")["pipeline"] == "e1"
    explicit = _json_line("%s; restart %d of %d", "pipeline p interrupted: broker away", 1, 5, pipeline="p2")
    assert explicit["pipeline"] == "p2", "extra= wins over the message"
    assert message_fields("every ingest pipeline is idle: starting the exports") == {}
