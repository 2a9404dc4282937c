"""`cdc-lakehouse rebuild-state CONFIG --pipeline NAME`: a new checkpoint whose materializer state is
seeded from the pipeline's Delta table, so an incompatible upgrade (`plan_upgrade`) does not need a
replay from the beginning of the topics.

What it does, with the service stopped:
1. Finds where the table's content ends: the last micro-batch of the current checkpoint that the
   table holds (the Delta commits carry the checkpoint's application id and batch id), and that
   batch's end offsets in the checkpoint's offset log (`offsets/<batch>`).
2. Reads the table and turns every row into the materializer state of its primary key: one live
   row, under the upsert key computed from the row's columns (the state the rules keep between
   barriers when a key has one live row).
3. Moves the checkpoint aside (`<checkpoint>.before-rebuild-<UTC time>`, kept for a rollback: Spark's
   state schema files name the checkpoint's absolute path, so it only works again moved back in
   place) and creates the new one holding only the seed (`rebuilt_state/`): the state rows and the
   offsets to start from.
On its next start the pipeline reads the seed (`load_seed`): the materializer applies it as its
initial state on the first micro-batch, and the source starts at the seed's offsets; the new
checkpoint stores the new plan.

Limitations (printed by the command, `LIMITATIONS`): the table shows one row per primary key, so
only that row is rebuilt. Refused: several topics into one table (a live row's upsert key names its
source topic, which the table does not hold), no upsert key (retractions match the whole row's
source text), key columns other than integers, text or booleans (their text form in the source
may differ from the table's), and an old checkpoint that ran with watermark compaction or an
ORDER BY buffer (changes waiting there are not in the table yet).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from connectors.kafka import offsets as om
from service.checkpoints import local_path
from service.compiled_plan import pipeline_operators
from service.errors import ConfigError
from service.kafka_to_delta.debezium_json import canonical_key
from service.kafka_to_delta.materializer_buckets import SEED_COLUMNS
from service.kafka_to_delta.materializer_state import LiveRow, PkState, encode_state
from service.kafka_to_delta.pipeline import app_id
from service.plan_upgrade import PLAN_FILE
from service.rebuilt_seed import SEED_DIR, SEED_INFO, SEED_ROWS
from service.settings import PipelineSettings, Settings

MOVED_SUFFIX = ".before-rebuild-"
SEEDED_POSITION = -1  # partition and offset of a seeded live row: it came from the table, not a record
LIMITATIONS = (
    "only the row the table shows per primary key is rebuilt: under on_conflict deduplicate the earlier live "
    "rows of a key (what a rollback would return to) and, under nothing, the rows dropped as conflicts are gone",
    "sequence_by: a seeded row has no sequence and deleted keys have no tombstone: a change older than the "
    "table's row that arrives after the rebuild is applied, and a late older upsert of a deleted key revives it",
    "a seeded row counts as last touched at the old checkpoint's last watermark (or batch time) for the state TTL",
    "the FROM_CHANGELOG previous images start empty: the first change of a key after the rebuild is taken as an insert",
)
_KEY_TYPES = (pa.types.is_integer, pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view,
              pa.types.is_boolean)


@dataclass(frozen=True)
class Cut:
    """Where the table's content ends in the old checkpoint."""

    batch: int
    offsets: dict[str, dict[str, int]]
    touched_ms: int


@dataclass(frozen=True)
class RebuildReport:
    """What `rebuild_state` did."""

    pipeline: str
    table_uri: str
    table_version: int
    cut: Cut
    keys: int
    old_checkpoint: Path
    moved_to: Path
    new_checkpoint: Path

    def lines(self) -> list[str]:
        """The command's output."""
        starts = ", ".join(f"{topic}[{part}]@{offset}" for topic, parts in sorted(self.cut.offsets.items())
                           for part, offset in sorted(parts.items(), key=lambda item: int(item[0])))
        return [
            f"pipeline {self.pipeline}: materializer state rebuilt from {self.table_uri} (version {self.table_version})",
            f"  {self.keys} primary key(s) seeded, one live row each",
            f"  the table holds batch {self.cut.batch} of the old checkpoint: the new one starts at {starts or '-'}",
            f"  old checkpoint moved to {self.moved_to} (to go back: move it back to {self.old_checkpoint}, where "
            "its state files expect to be, and run the old config; delete it once the new run is checked)",
            f"  new checkpoint {self.new_checkpoint}: seeded on its first micro-batch; "
            f"start the pipeline with the new config",
            "  limitations:",
            *[f"  - {text}" for text in LIMITATIONS],
        ]


def _pipeline(settings: Settings, name: str) -> PipelineSettings:
    found = next((p for p in settings.pipelines if p.name == name), None)
    if found is None:
        raise ConfigError(f"no pipeline {name!r} in the config (pipelines: {[p.name for p in settings.pipelines]})")
    if not found.materialized:
        raise ConfigError(f"pipeline {name}: no materializer, so no state to rebuild: start a new checkpoint "
                          "from a chosen offset (starting_offsets) instead")
    if len(found.topics) > 1:
        raise ConfigError(f"pipeline {name}: several topics feed the table; a live row's upsert key names its "
                          "topic, which the table does not hold: its state cannot be rebuilt from the table")
    if not found.effective_upsert_key:
        raise ConfigError(f"pipeline {name}: no upsert key (retractions match the whole row's source text, "
                          "which the table does not keep): its state cannot be rebuilt from the table")
    return found


def _buffers_changes(nodes: list[dict[str, Any]]) -> bool:
    return any(node.get("kind") == "order_by" or (node.get("properties") or {}).get("compaction") == "watermark"
               for node in nodes)


def _checkpoint(settings: Settings, pipeline: PipelineSettings) -> Path:
    name = pipeline.name
    root = local_path(settings.checkpoint_dir(name))
    if root is None:
        raise ConfigError(f"pipeline {name}: rebuild-state works on a local checkpoint, not "
                          f"{settings.checkpoint_dir(name)}")
    if (root / SEED_DIR).is_dir() and not (root / "metadata").exists():
        raise ConfigError(f"pipeline {name}: checkpoint {root} holds a rebuilt state that has not run yet: "
                          "start the pipeline")
    if not (root / "metadata").exists():
        raise ConfigError(f"pipeline {name}: no started checkpoint at {root}: nothing to rebuild")
    plan = root / PLAN_FILE  # the plan the checkpoint ran under; without one, the config's
    nodes = json.loads(plan.read_text()).get("nodes", []) if plan.exists() else [
        op.as_json() for op in pipeline_operators(pipeline)]
    if _buffers_changes(nodes):
        raise ConfigError(f"pipeline {name}: checkpoint {root} buffers changes for the watermark (ORDER BY "
                          "or compaction watermark) that are not in the table yet: replay instead")
    return root


def _cut(checkpoint: Path, pipeline: PipelineSettings, table: DeltaTable) -> Cut:
    query_id = json.loads((checkpoint / "metadata").read_text())["id"]
    batch = table.transaction_version(app_id(pipeline, query_id))
    if batch is None:
        raise ConfigError(f"pipeline {pipeline.name}: the table holds no batch of checkpoint {checkpoint} "
                          "(application id not found in its commits): nothing to start from")
    entry = checkpoint / "offsets" / str(batch)
    if not entry.exists():
        raise ConfigError(f"pipeline {pipeline.name}: the table holds batch {batch} but {entry} is missing")
    _, metadata, source = entry.read_text().splitlines()[:3]
    times = json.loads(metadata)
    touched = int(times.get("batchWatermarkMs") or 0) or int(times.get("batchTimestampMs") or 0)
    return Cut(batch, om.to_map(om.from_map(json.loads(source))), touched)


def _check_key_types(schema: pa.Schema, pipeline: PipelineSettings) -> None:
    for column in dict.fromkeys(pipeline.primary_key + pipeline.effective_upsert_key):
        if column not in schema.names:
            raise ConfigError(f"pipeline {pipeline.name}: key column {column!r} is not in the table")
        kind = schema.field(column).type
        if not any(check(kind) for check in _KEY_TYPES):
            raise ConfigError(f"pipeline {pipeline.name}: key column {column!r} is {kind}: its text in the "
                              "source may differ from the table's, so the state cannot be rebuilt from the table")


def seed_states(rows: list[dict[str, Any]], pipeline: PipelineSettings, touched_ms: int) -> dict[str, list]:
    """The seed columns (`SEED_COLUMNS`) of table rows: per primary key, the rules' state holding the row as
    its one live row under its upsert key."""
    topic = pipeline.topics[0]
    upsert_key = pipeline.effective_upsert_key
    out: dict[str, list] = {name: [] for name in SEED_COLUMNS}
    for row in rows:
        pk = canonical_key([row[c] for c in pipeline.primary_key])
        key = pk if upsert_key == pipeline.primary_key else canonical_key([row[c] for c in upsert_key])
        text = orjson.dumps(row, default=str).decode()
        live = LiveRow(key, text, (topic, SEEDED_POSITION, SEEDED_POSITION))
        for name, value in zip(SEED_COLUMNS, (pk, encode_state(PkState([live])), touched_ms)):
            out[name].append(value)
    return out


def _table_rows(table: DeltaTable) -> Iterator[list[dict[str, Any]]]:
    for batch in table.to_pyarrow_dataset().to_batches():
        yield batch.to_pylist()


def _write_seed(directory: Path, table: DeltaTable, pipeline: PipelineSettings, cut: Cut) -> int:
    schema = pa.schema([(SEED_COLUMNS[0], pa.string()), (SEED_COLUMNS[1], pa.string()), (SEED_COLUMNS[2], pa.int64())])
    directory.mkdir(parents=True)
    keys = 0
    with pq.ParquetWriter(directory / SEED_ROWS, schema) as writer:
        for rows in _table_rows(table):
            writer.write_table(pa.table(seed_states(rows, pipeline, cut.touched_ms), schema=schema))
            keys += len(rows)
    info = {"pipeline": pipeline.name, "table_version": table.version(), "batch": cut.batch,
            "starting_offsets": cut.offsets, "keys": keys}
    (directory / SEED_INFO).write_text(json.dumps(info, indent=2))
    return keys


def rebuild_state(settings: Settings, name: str, now: datetime | None = None) -> RebuildReport:
    """Seed a new checkpoint of pipeline `name` from its Delta table; the old checkpoint is moved aside."""
    pipeline = _pipeline(settings, name)
    checkpoint = _checkpoint(settings, pipeline)
    uri = settings.lakehouse.table_uri(pipeline.table)
    try:
        table = DeltaTable(uri, storage_options=settings.lakehouse.storage_options or None)
    except TableNotFoundError:
        raise ConfigError(f"pipeline {name}: no Delta table at {uri}: nothing to rebuild from") from None
    _check_key_types(pa.schema(table.schema().to_arrow()), pipeline)
    cut = _cut(checkpoint, pipeline, table)
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    moved = checkpoint.with_name(f"{checkpoint.name}{MOVED_SUFFIX}{stamp}")
    staged = checkpoint.with_name(f"{checkpoint.name}.rebuilding-{stamp}")
    try:
        keys = _write_seed(staged / SEED_DIR, table, pipeline, cut)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    checkpoint.rename(moved)
    staged.rename(checkpoint)
    return RebuildReport(name, uri, table.version(), cut, keys, checkpoint, moved, checkpoint)
