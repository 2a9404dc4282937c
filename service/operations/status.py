"""`cdc-lakehouse status`: where each pipeline and export stands, read from its checkpoint, Kafka and Delta.

Per pipeline: the last batch Spark committed and its source offsets, the topic end offsets
and the lag between them, and the Delta table's version and last committed batch. Delta one
batch ahead of the checkpoint is the normal trace of a stop between the two commits: the
next start replays that batch and skips it. Reads local checkpoints (no Spark needed).

Per export: the last batch Spark committed and the last table version it covers, the last
version committed to Kafka (the export position, read_committed; it may be one batch ahead
of the checkpoint for the same reason), the table's version, and the versions not yet
published between them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from connectors.delta.delta_rs import DeltaRsTable
from connectors.kafka import offsets as om
from connectors.kafka.cluster import ClusterView
from connectors.kafka.transactional_producer import TransactionalProducer
from service.config.databases import DatabaseSettings
from service.config.exports import ExportSettings
from service.config.settings import PipelineSettings, Settings
from service.delta_to_kafka.export_position import (
    DEFAULT_POSITIONS_TOPIC,
    TRANSACTIONAL_ID_PREFIX,
    ExportPosition,
)
from service.runtime import quarantine
from service.supervisor.batch_pipeline import commit_app_id
from vocabulary.errors import ConfigError


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
    quarantined: str | None = None
    """A database source's table set aside: at which batch and why."""

    @property
    def lag(self) -> int:
        """Records in the topics that this pipeline has not committed yet."""
        done = om.from_map(self.committed)
        return sum(high - done.get(tp, 0) for tp, high in om.from_map(self.end).items())

    def as_dict(self) -> dict:
        """JSON-friendly form."""
        return {"kind": "pipeline", "pipeline": self.name, "table": self.table_uri, "table_version": self.table_version,
                "checkpoint_batch": self.checkpoint_batch, "delta_batch": self.delta_batch,
                "lag": self.lag, "committed_offsets": self.committed, "end_offsets": self.end,
                "quarantined": self.quarantined}


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
    delta_batch = table.last_batch(commit_app_id(pipeline.name, pipeline.table, query_id)) if query_id else None
    topics_only = om.to_map(om.from_map(committed))  # without the source's reserved keys (watermarks)
    return PipelineStatus(pipeline.name, table.uri, batch, delta_batch, table.version(), topics_only, end)


def database_status(settings: Settings, database: DatabaseSettings, cluster: ClusterView) -> list[PipelineStatus]:
    """Status of each table of a database source (named `<database>.<table>`), from the topics it matches now."""
    checkpoint = settings.checkpoint_dir(database.name)
    query_id, batch, committed = _checkpoint(checkpoint)
    set_aside = quarantine.read(f"{checkpoint.removeprefix('file://').rstrip('/')}/{quarantine.FILE_NAME}")
    routes = database.shared_routes(cluster.topic_names())  # a table with its own query is a pipeline
    marks = cluster.watermarks(cluster.partitions(sorted(routes)))
    done = om.from_map(committed)
    found = []
    for topic, name in sorted(routes.items(), key=lambda item: item[1]):
        table = DeltaRsTable(settings.lakehouse.table_uri(name), settings.lakehouse.storage_options)
        delta_batch = table.last_batch(commit_app_id(database.name, name, query_id)) if query_id else None
        entry = set_aside.get(name)
        why = None if entry is None else f"{entry.get('state')} at batch {entry.get('batch_id')}: {entry.get('reason')}"
        found.append(PipelineStatus(
            f"{database.name}.{name}", table.uri, batch, delta_batch, table.version(),
            om.to_map({tp: offset for tp, offset in done.items() if tp[0] == topic}),
            om.to_map({tp: high for tp, (_, high) in marks.items() if tp[0] == topic}), why,
        ))
    return found


@dataclass(frozen=True)
class ExportStatus:
    """One export's position in its checkpoint, in Kafka and against its Delta table."""

    name: str
    table_uri: str
    topic: str
    checkpoint_batch: int | None
    checkpoint_version: int | None  # the last table version the checkpoint's last batch covers
    published_version: int | None  # the last version committed to Kafka (the export position)
    table_version: int | None

    @property
    def lag(self) -> int:
        """Table versions not yet published to Kafka."""
        if self.table_version is None:
            return 0
        done = self.published_version if self.published_version is not None else self.checkpoint_version
        return max(0, self.table_version - (-1 if done is None else done))

    def as_dict(self) -> dict:
        """JSON-friendly form."""
        return {"kind": "export", "export": self.name, "table": self.table_uri, "topic": self.topic,
                "table_version": self.table_version, "checkpoint_batch": self.checkpoint_batch,
                "checkpoint_version": self.checkpoint_version, "published_version": self.published_version,
                "lag": self.lag}


def _published(settings: Settings, export: ExportSettings, uri: str, cluster: ClusterView) -> int | None:
    """The version of the export's committed position in Kafka (None: none yet, or of another table)."""
    if not cluster.partitions([DEFAULT_POSITIONS_TOPIC]):
        return None
    reader = TransactionalProducer(settings.kafka.client_config(), f"{TRANSACTIONAL_ID_PREFIX}{export.name}",
                                   export.topic, DEFAULT_POSITIONS_TOPIC)  # never opened: reads only
    value = reader.last_committed_position(export.name, stable_only=True)  # no wait for other writers
    if value is None:
        return None
    position = ExportPosition.from_value(export.name, value, DEFAULT_POSITIONS_TOPIC)
    return position.version if position.table == uri else None


def export_status(settings: Settings, export: ExportSettings, cluster: ClusterView) -> ExportStatus:
    """Status of one export."""
    _, batch, offsets = _checkpoint(settings.checkpoint_dir(export.name))
    uri = settings.lakehouse.table_uri(export.table)
    table = DeltaRsTable(uri, settings.lakehouse.storage_options)
    covered = int(offsets["version"]) - 1 if "version" in offsets else None
    return ExportStatus(export.name, uri, export.topic, batch, covered, _published(settings, export, uri, cluster),
                        table.version())


def status(settings: Settings) -> list[PipelineStatus | ExportStatus]:
    """Status of every configured pipeline and database table, then of every export."""
    cluster = ClusterView(settings.kafka.client_config())
    try:
        found: list[PipelineStatus | ExportStatus] = [pipeline_status(settings, p, cluster) for p in settings.pipelines]
        found += [table for d in settings.databases for table in database_status(settings, d, cluster)]
        return found + [export_status(settings, e, cluster) for e in settings.exports]
    finally:
        cluster.close()
