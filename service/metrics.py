"""Prometheus metrics of the service, labelled by pipeline; served over HTTP when configured."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

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
RESTARTS = Counter("cdc_pipeline_restarts", "Restarts after transient failures", PIPELINE)
LAST_BATCH = Gauge("cdc_last_committed_batch", "Id of the last batch committed to Delta", PIPELINE)
STAGE_SECONDS = Histogram(
    "cdc_batch_stage_seconds", "Time per micro-batch stage", PIPELINE + ("stage",),
    buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128),
)


def record_state(pipeline: str, progress: dict | None) -> None:
    """State store figures of a streaming query's last progress (no-op without stateful operators)."""
    operators = (progress or {}).get("stateOperators") or []
    if operators:
        STATE_ROWS.labels(pipeline).set(sum(op["numRowsTotal"] for op in operators))
        STATE_BYTES.labels(pipeline).set(sum(op["memoryUsedBytes"] for op in operators))


def serve(port: int, address: str) -> None:
    """Expose /metrics on `address:port` (a daemon thread)."""
    start_http_server(port, addr=address)
