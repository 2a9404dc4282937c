"""Prometheus metrics of the service, labelled by pipeline; served over HTTP when configured."""

from __future__ import annotations

from http.server import ThreadingHTTPServer
from typing import Any, Callable

from prometheus_client import Counter, Gauge, Histogram

from service.observability import health

PIPELINE = ("pipeline",)

BATCHES = Counter("cdc_batches", "Micro-batches by result", PIPELINE + ("result",))
CHANGES = Counter("cdc_changes", "Changelog rows decoded from Kafka (an update with before image: -U, +U)", PIPELINE)
UPSERTS = Counter("cdc_upserts", "Net upserts merged into Delta", PIPELINE)
DELETES = Counter("cdc_deletes", "Net deletes merged into Delta", PIPELINE)
DECODE_ERRORS = Counter(
    "cdc_decode_errors", "Records that could not become changes (any policy)", PIPELINE
)
BAD_RECORDS = Counter(
    "cdc_bad_records", "Records dropped or dead-lettered by policy", PIPELINE + ("handling", "stage")
)
RANGES = Counter(
    "cdc_ranges", "Kafka ranges read by the plain path, and Avro ranges read for the materializer's bucket "
    "stage, by decode: vectorised or record_by_record (a range holding something only the record-by-record "
    "decode decides)", PIPELINE + ("decode",)
)
ODD_RECORDS = Counter(
    "cdc_odd_records", "Records of vectorised Kafka ranges decoded record by record (truncates, messages, "
    "records the bulk decode does not vouch for)", PIPELINE
)
CONFLICTS = Counter("cdc_conflicts", "Primary-key conflicts resolved by on_conflict", PIPELINE + ("strategy",))
ROLLBACKS = Counter("cdc_rollbacks", "Rollbacks to a previous live row (deduplicate)", PIPELINE)
STALE_DROPPED = Counter("cdc_stale_changes_dropped", "Changes older than the stored sequence", PIPELINE)
CLEARED_STATE = Counter(
    "cdc_cleared_state_warnings", "Retractions that found no state (expired or never seen)", PIPELINE
)
STATE_ROWS = Gauge(
    "cdc_state_rows", "Rows in the state store (live keys, plus waiting changes and timers with a watermark or TTL)",
    PIPELINE,
)
STATE_BYTES = Gauge("cdc_state_memory_bytes", "Memory used by the pipeline's state store", PIPELINE)
QUARANTINED = Gauge(
    "cdc_table_quarantined", "1 while a database source's table is set aside after a terminal error",
    PIPELINE + ("table",),
)
RESTARTS = Counter("cdc_pipeline_restarts", "Restarts after transient failures", PIPELINE)
LAST_BATCH = Gauge("cdc_last_committed_batch", "Id of the last batch committed to Delta", PIPELINE)
LAG_RECORDS = Gauge(
    "cdc_pipeline_lag_records", "Kafka records an ingest pipeline has not processed (as of its last progress)",
    PIPELINE,
)
LAG_VERSIONS = Gauge(
    "cdc_export_lag_versions", "Delta versions an export has not published (as of its last progress)", PIPELINE
)
STAGE_SECONDS = Histogram(
    "cdc_batch_stage_seconds", "Time per micro-batch stage", PIPELINE + ("stage",),
    buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128),
)


MAINTENANCE_RUNS = Counter(
    "cdc_maintenance_runs", "Table maintenance steps by result (done, refused by the retention rule, failed)",
    PIPELINE + ("step", "result"),
)
MAINTENANCE_FILES_REMOVED = Counter(
    "cdc_maintenance_files_removed", "Files removed by maintenance (compact: small files rewritten; vacuum: deleted)",
    PIPELINE + ("step",),
)
MAINTENANCE_SECONDS = Histogram(
    "cdc_maintenance_seconds", "Time per table maintenance step", PIPELINE + ("step",),
    buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128),
)


def record_state(pipeline: str, progress: dict | None) -> None:
    """State store figures of a streaming query's last progress (no-op without stateful operators)."""
    operators = (progress or {}).get("stateOperators") or []
    if operators:
        STATE_ROWS.labels(pipeline).set(sum(op["numRowsTotal"] for op in operators))
        STATE_BYTES.labels(pipeline).set(sum(op["memoryUsedBytes"] for op in operators))


def record_lag(pipeline: str, progress: Any, export: bool) -> None:
    """Lag of a pipeline (records) or an export (versions) from its query's last progress."""
    behind = health.versions_behind(progress) if export else health.records_behind(progress)
    if behind is not None:
        (LAG_VERSIONS if export else LAG_RECORDS).labels(pipeline).set(behind)


def serve(port: int, address: str, readiness: Callable[[], health.Readiness] | None = None) -> ThreadingHTTPServer:
    """Serve /metrics, /healthz and /readyz on `address:port` (daemon threads); returns the server."""
    from service.observability.http_endpoints import serve_endpoints

    return serve_endpoints(port, address, readiness or health.Readiness)
