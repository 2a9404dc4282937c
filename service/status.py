"""`cdc-lakehouse status`: where each pipeline stands, read from its checkpoint, Kafka and Delta.

Per pipeline: the last batch Spark committed and its source offsets, the topic end offsets
and the lag between them, and the Delta table's version and last committed batch. Delta one
batch ahead of the checkpoint is the normal trace of a stop between the two commits: the
next start replays that batch and skips it. Reads local checkpoints (no Spark needed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from connectors.delta.delta_rs import DeltaRsTable
from connectors.kafka import offsets as om
from connectors.kafka.cluster import ClusterView
from service.errors import ConfigError
from service.kafka_to_delta.pipeline import app_id
from service.settings import PipelineSettings, Settings


@dataclass(frozen=True)
class PipelineStatus:
    """One pipeline's position in Kafka, in its checkpoint and in Delta."""

    name: str
    table_uri: str
    checkpoint_batch: int | None
    delta_batch: int | None
    table_version: int | None
    committed: dict[str, dict[str, int]] = field(default_factory=dict)
    end: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def lag(self) -> int:
        """Records in the topics that this pipeline has not committed yet."""
        done = om.from_map(self.committed)
        return sum(high - done.get(tp, 0) for tp, high in om.from_map(self.end).items())

    def as_dict(self) -> dict:
        """JSON-friendly form."""
        return {"pipeline": self.name, "table": self.table_uri, "table_version": self.table_version,
                "checkpoint_batch": self.checkpoint_batch, "delta_batch": self.delta_batch,
                "lag": self.lag, "committed_offsets": self.committed, "end_offsets": self.end}


def _last_batch(directory: Path) -> int | None:
    batches = [int(p.name) for p in directory.glob("[0-9]*") if p.name.isdigit()] if directory.is_dir() else []
    return max(batches) if batches else None


def _checkpoint(root: str) -> tuple[str | None, int | None, dict]:
    """(query id, last committed batch, its source offsets) of a local checkpoint."""
    if "://" in root and not root.startswith("file://"):
        raise ConfigError(f"status reads local checkpoints only, not {root}")
    path = Path(root.removeprefix("file://"))
    if not (path / "metadata").exists():
        return None, None, {}
    query_id = json.loads((path / "metadata").read_text())["id"]
    batch = _last_batch(path / "commits")
    if batch is None:
        return query_id, None, {}
    source_offsets = (path / "offsets" / str(batch)).read_text().splitlines()[2]
    return query_id, batch, json.loads(source_offsets)


def pipeline_status(settings: Settings, pipeline: PipelineSettings, cluster: ClusterView) -> PipelineStatus:
    """Status of one pipeline."""
    query_id, batch, committed = _checkpoint(settings.checkpoint_dir(pipeline.name))
    table = DeltaRsTable(settings.lakehouse.table_uri(pipeline.table), settings.lakehouse.storage_options)
    marks = cluster.watermarks(cluster.partitions(list(pipeline.topics)))
    end = om.to_map({tp: high for tp, (_, high) in marks.items()})
    delta_batch = table.last_batch(app_id(pipeline, query_id)) if query_id else None
    return PipelineStatus(pipeline.name, table.uri, batch, delta_batch, table.version(), committed, end)


def status(settings: Settings) -> list[PipelineStatus]:
    """Status of every configured pipeline."""
    cluster = ClusterView(settings.kafka.client_config())
    try:
        return [pipeline_status(settings, p, cluster) for p in settings.pipelines]
    finally:
        cluster.close()
