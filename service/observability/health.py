"""Readiness and lag of the running pipelines, read from their streaming queries on the driver.

Ready means, for every configured pipeline and export: its query has started, is active, is not
waiting to be restarted after a transient failure, has completed a trigger, and is either
waiting for its next trigger or running one that started recently enough. "Recently enough":
the last progress Spark reported is younger than `readiness_stale_triggers` trigger intervals
plus Spark's idle progress interval (`spark.sql.streaming.noDataProgressEventInterval`, 10 s by
default: an idle query reports progress only that often). A broker that stops answering leaves
a trigger hanging in offset planning, then fails the query: the pipeline turns unready either
way, and ready again once a restarted query completes a trigger. A micro-batch's commit that failed behind
the running query (`commits_behind`) turns it unready at once, though the query raises it only with its next
batch (an idle continuous query may not run one for a while).

Lag comes from the query's last progress, not from a broker call: for an ingest pipeline the
records between the end offsets of its last batch and the latest offsets its source saw; for an
export the Delta versions between the end of its last batch and the table's latest version.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from connectors.kafka import offsets as om

IDLE_PROGRESS_CONF = "spark.sql.streaming.noDataProgressEventInterval"
DEFAULT_IDLE_PROGRESS_S = 10.0
_VERSION = "version"


class QueryView(Protocol):
    """The parts of a Spark `StreamingQuery` readiness looks at."""

    @property
    def isActive(self) -> bool: ...  # noqa: N802 - Spark's name

    @property
    def status(self) -> dict: ...

    @property
    def lastProgress(self) -> Any: ...  # noqa: N802 - Spark's name


@dataclass(frozen=True)
class PipelineHealth:
    """One pipeline's readiness; `reason` says why it is not ready."""

    name: str
    ready: bool
    reason: str | None = None


@dataclass(frozen=True)
class Readiness:
    """Readiness of the whole process: ready when every pipeline is."""

    pipelines: tuple[PipelineHealth, ...] = field(default_factory=tuple)

    @property
    def ready(self) -> bool:
        """True when there is at least one pipeline and all are ready."""
        return bool(self.pipelines) and all(p.ready for p in self.pipelines)

    def as_dict(self) -> dict:
        """The JSON body of /readyz."""
        return {"ready": self.ready,
                "pipelines": {p.name: {"ready": p.ready, "reason": p.reason} for p in self.pipelines}}


def progress_end(progress: Any) -> float:
    """When the trigger of `progress` ended (epoch seconds)."""
    started = datetime.fromisoformat(str(progress["timestamp"]).replace("Z", "+00:00")).timestamp()
    duration_ms = (progress["durationMs"] or {}).get("triggerExecution", 0)
    return started + duration_ms / 1000.0


def query_health(name: str, query: QueryView | None, *, restarting: bool, finished: bool,
                 max_age_s: float, now: float | None = None, failed_commit: BaseException | None = None) -> PipelineHealth:
    """Readiness of one pipeline (see the module docstring for the rules). `failed_commit`: a micro-batch's commit
    that failed behind the running query (`commits_behind`), which the query raises only with its next batch."""
    if query is None:
        return PipelineHealth(name, False, "query not started")
    if restarting:
        return PipelineHealth(name, False, "restarting after a transient failure")
    if finished:
        return PipelineHealth(name, False, "query finished")
    if not query.isActive:
        return PipelineHealth(name, False, "query stopped")
    if failed_commit is not None:
        return PipelineHealth(name, False, f"a batch's commit failed behind the query (raised with its next batch): "
                                           f"{type(failed_commit).__name__}: {failed_commit}")
    progress = query.lastProgress
    if progress is None:
        return PipelineHealth(name, False, "no trigger completed yet")
    if not query.status.get("isTriggerActive"):
        return PipelineHealth(name, True)
    age = (time.time() if now is None else now) - progress_end(progress)
    if age > max_age_s:
        return PipelineHealth(name, False, f"trigger running, last progress {age:.0f}s ago (limit {max_age_s:.0f}s)")
    return PipelineHealth(name, True)


def max_progress_age(stale_triggers: int, trigger_interval_s: float, idle_progress_s: float) -> float:
    """Seconds a running trigger may go without progress before the pipeline counts as stuck."""
    return stale_triggers * trigger_interval_s + idle_progress_s


def idle_progress_seconds(spark) -> float:
    """Spark's interval between progress reports of an idle query."""
    text = spark.conf.get(IDLE_PROGRESS_CONF, None)
    if not text:
        return DEFAULT_IDLE_PROGRESS_S
    return spark._jvm.org.apache.spark.network.util.JavaUtils.timeStringAsMs(text) / 1000.0


def _offsets(text: str | None) -> dict:
    document = json.loads(text) if text else None
    return document if isinstance(document, dict) else {}


def records_behind(progress: Any) -> int | None:
    """Kafka records between the last batch's end offsets and the latest offsets seen; None before any progress."""
    if progress is None:
        return None
    total = 0
    for source in progress["sources"]:
        end = om.from_map(_offsets(source["endOffset"]))
        latest = om.from_map(_offsets(source["latestOffset"]))
        total += sum(max(0, high - end.get(tp, 0)) for tp, high in latest.items())
    return total


def versions_behind(progress: Any) -> int | None:
    """Delta versions between the last batch's end and the latest version seen; None before any progress."""
    if progress is None:
        return None
    total = 0
    for source in progress["sources"]:
        end, latest = _offsets(source["endOffset"]), _offsets(source["latestOffset"])
        if _VERSION in latest:
            total += max(0, int(latest[_VERSION]) - int(end.get(_VERSION, 0)))
    return total
