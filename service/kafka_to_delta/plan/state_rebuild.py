"""`cdc-lakehouse rebuild-state CONFIG --pipeline NAME`: a new checkpoint whose materializer state is
seeded from the pipeline's Delta table, so an incompatible upgrade (`plan_upgrade`) does not need a
replay from the beginning of the topics.

What it does, with the service stopped:
1. Finds where the table's content ends: the last micro-batch of the current checkpoint that the
   table holds (the Delta commits carry the checkpoint's application id and batch id), and that
   batch's end offsets in the checkpoint's offset log (`offsets/<batch>`).
2. Reads the table and turns every row into the materializer state of its primary key: one live
   row (the state the rules keep between barriers when a key has one live row). Where the row came
   from is taken from the old checkpoint's state when Spark's state reader can read it and the
   materializer's key is unchanged (`checkpoint_state`): the upsert key (with its topic), position
   and sequence the row was applied with, and the key's tombstones (keys deleted with sequence_by
   keep theirs too). A row that state no longer holds (its TTL ran out), or every row when it
   cannot be read, is seeded from the table alone: upsert key computed from the row's columns.
3. Moves the checkpoint aside (`<checkpoint>.before-rebuild-<UTC time>`, kept for a rollback: Spark's
   state schema files name the checkpoint's absolute path, so it only works again moved back in
   place) and creates the new one holding only the seed (`rebuilt_state/`): the state rows and the
   offsets to start from.
On its next start the pipeline reads the seed (`load_seed`): the materializer applies it as its
initial state on the first micro-batch, and the source starts at the seed's offsets; the new
checkpoint stores the new plan.

Limitations (printed by the command, `LIMITATIONS`): the table shows one row per primary key, so
only that row is rebuilt. Refused: primary-key columns other than integers, text or booleans (their
text form in the source may differ from the table's), an old checkpoint that ran with watermark
compaction or an ORDER BY buffer (changes waiting there are not in the table yet), and, when the
old state cannot be used, what the table alone cannot say: several topics into one table (a live
row's upsert key names its topic), no upsert key (retractions match the source's whole-row text).
A row of such a pipeline that the readable old state no longer holds is left unseeded, as the old
pipeline had forgotten it too.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from connectors.delta.table_scan import scan
from connectors.kafka import offsets as om
from service.config.settings import PipelineSettings, Settings
from service.kafka_to_delta.formats.debezium_json import canonical_key
from service.kafka_to_delta.materialize.bucket_stage import SEED_COLUMNS
from service.kafka_to_delta.materialize.key_state import LiveRow, PkState, encode_state
from service.kafka_to_delta.materialize.row_digest import is_digest
from service.kafka_to_delta.plan.checkpoint_state import OldState, read_old_state
from service.kafka_to_delta.plan.compiled_plan import Kind, pipeline_operators
from service.kafka_to_delta.plan.rebuilt_seed import SEED_DIR, SEED_INFO, SEED_ROWS
from service.kafka_to_delta.plan.upgrades import PLAN_FILE
from service.runtime.checkpoints import local_path
from service.supervisor.batch_pipeline import commit_app_id
from vocabulary.errors import ConfigError

MOVED_SUFFIX = ".before-rebuild-"
SEEDED_POSITION = -1  # partition and offset of a seeded live row: it came from the table, not a record
LIMITATIONS = (
    "only the row the table shows per primary key is rebuilt: under on_conflict deduplicate the earlier live "
    "rows of a key (what a rollback would return to) and, under nothing, the rows dropped as conflicts are gone",
    "a row seeded from the table alone has its upsert key computed from its columns, no sequence and no "
    "tombstones: with sequence_by a change older than it that arrives after the rebuild is applied",
    "a seeded row counts as last touched at the old checkpoint's last watermark (or batch time) for the state TTL",
    "the FROM_CHANGELOG previous images start empty: the first change of a key after the rebuild is taken as an insert",
)
StateReader = Callable[[Path, int], "OldState | None"]
_KEY_TYPES = (pa.types.is_integer, pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view,
              pa.types.is_boolean)


@dataclass(frozen=True)
class Cut:
    """Where the table's content ends in the old checkpoint."""

    batch: int
    offsets: dict[str, dict[str, int]]
    touched_ms: int


@dataclass
class SeedCounts:
    """How the primary keys were seeded."""

    with_origin: int = 0
    from_table: int = 0
    unseeded: int = 0
    tombstones_only: int = 0

    @property
    def rows(self) -> int:
        """Primary keys seeded with a live row."""
        return self.with_origin + self.from_table


@dataclass(frozen=True)
class RebuildReport:
    """What `rebuild_state` did."""

    pipeline: str
    table_uri: str
    table_version: int
    cut: Cut
    counts: SeedCounts
    old_checkpoint: Path
    moved_to: Path
    new_checkpoint: Path

    def lines(self) -> list[str]:
        """The command's output."""
        starts = ", ".join(f"{topic}[{part}]@{offset}" for topic, parts in sorted(self.cut.offsets.items())
                           for part, offset in sorted(parts.items(), key=lambda item: int(item[0])))
        return [
            f"pipeline {self.pipeline}: materializer state rebuilt from {self.table_uri} (version {self.table_version})",
            f"  {self.counts.rows} primary key(s) seeded, one live row each: {self.counts.with_origin} with where "
            f"it came from taken from the old checkpoint's state, {self.counts.from_table} from the table alone",
            *([f"  {self.counts.unseeded} row(s) the old state no longer held left unseeded (the old pipeline had "
               "forgotten them too)"] if self.counts.unseeded else []),
            *([f"  {self.counts.tombstones_only} deleted key(s) keep their tombstones"]
              if self.counts.tombstones_only else []),
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
    return found


def _table_alone_refusal(pipeline: PipelineSettings) -> str | None:
    """Why the table alone cannot tell a row's upsert key (None: it can)."""
    if len(pipeline.topics) > 1:
        return "several topics feed the table; a live row's upsert key names its topic, which the table does not hold"
    if not pipeline.effective_upsert_key:
        return "no upsert key: retractions match the whole row's source text, which the table does not keep"
    return None


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
    batch = table.transaction_version(commit_app_id(pipeline.name, pipeline.table, query_id))
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


def _check_key_types(schema: pa.Schema, pipeline: PipelineSettings, columns: tuple[str, ...]) -> None:
    for column in dict.fromkeys(columns):
        if column not in schema.names:
            raise ConfigError(f"pipeline {pipeline.name}: key column {column!r} is not in the table")
        kind = schema.field(column).type
        if not any(check(kind) for check in _KEY_TYPES):
            raise ConfigError(f"pipeline {pipeline.name}: key column {column!r} is {kind}: its text in the "
                              "source may differ from the table's, so the state cannot be rebuilt from the table")


def _from_table(row: dict[str, Any], pk: str, pipeline: PipelineSettings) -> LiveRow:
    upsert_key = pipeline.effective_upsert_key
    key = pk if upsert_key == pipeline.primary_key else canonical_key([row[c] for c in upsert_key])
    return LiveRow(key, orjson.dumps(row, default=str).decode(), (pipeline.topics[0], SEEDED_POSITION, SEEDED_POSITION))


def seed_states(rows: list[dict[str, Any]], pipeline: PipelineSettings, touched_ms: int, old: OldState | None = None,
                counts: SeedCounts | None = None) -> dict[str, list]:
    """The seed columns (`SEED_COLUMNS`) of table rows: per primary key, the rules' state holding the row as
    its one live row, as the old state remembers it (`old`), else from the table alone (when the table can
    tell its upsert key; else the key is left unseeded). `old` loses the keys seeded here."""
    counts = SeedCounts() if counts is None else counts
    table_alone = _table_alone_refusal(pipeline) is None
    out: dict[str, list] = {name: [] for name in SEED_COLUMNS}
    for row in rows:
        pk = canonical_key([row[c] for c in pipeline.primary_key])
        live = None if old is None else old.shown.pop(pk, None)
        tombstones = {} if old is None else old.tombstones.pop(pk, {})
        if live is not None:
            counts.with_origin += 1
            if is_digest(live.row) and not pipeline.one_live_row_per_key:  # the state kept a digest: the table has the row
                live = replace(live, row=_from_table(row, pk, pipeline).row)
        elif table_alone:
            live, tombstones = _from_table(row, pk, pipeline), {}
            counts.from_table += 1
        else:
            counts.unseeded += 1
            continue
        for name, value in zip(SEED_COLUMNS, (pk, encode_state(PkState([live], tombstones)), touched_ms)):
            out[name].append(value)
    return out


def tombstone_states(old: OldState, touched_ms: int, counts: SeedCounts) -> dict[str, list]:
    """The seed columns of the keys the old state holds tombstones of but the table no row."""
    out: dict[str, list] = {name: [] for name in SEED_COLUMNS}
    for pk, tombstones in old.tombstones.items():
        for name, value in zip(SEED_COLUMNS, (pk, encode_state(PkState([], tombstones)), touched_ms)):
            out[name].append(value)
    counts.tombstones_only += len(old.tombstones)
    return out


def _table_rows(table: DeltaTable) -> Iterator[list[dict[str, Any]]]:
    for batch in scan(table):
        yield batch.to_pylist()


def _write_seed(directory: Path, table: DeltaTable, pipeline: PipelineSettings, cut: Cut,
                old: OldState | None) -> SeedCounts:
    schema = pa.schema([(SEED_COLUMNS[0], pa.string()), (SEED_COLUMNS[1], pa.string()), (SEED_COLUMNS[2], pa.int64())])
    directory.mkdir(parents=True)
    counts = SeedCounts()
    with pq.ParquetWriter(directory / SEED_ROWS, schema) as writer:
        for rows in _table_rows(table):
            writer.write_table(pa.table(seed_states(rows, pipeline, cut.touched_ms, old, counts), schema=schema))
        if old is not None:
            writer.write_table(pa.table(tombstone_states(old, cut.touched_ms, counts), schema=schema))
    info = {"pipeline": pipeline.name, "table_version": table.version(), "batch": cut.batch,
            "starting_offsets": cut.offsets, "seeded": vars(counts)}
    (directory / SEED_INFO).write_text(json.dumps(info, indent=2))
    return counts


def _same_key(checkpoint: Path, pipeline: PipelineSettings) -> bool:
    """Whether the checkpoint's materializer was keyed as the config's is (its upsert keys still apply)."""
    plan = checkpoint / PLAN_FILE
    if not plan.exists():
        return False
    stored = {node.get("id"): node for node in json.loads(plan.read_text()).get("nodes", [])}
    current = next(op for op in pipeline_operators(pipeline) if op.kind == Kind.MATERIALIZER)
    return stored.get(current.id, {}).get("key") == list(current.key)


def _old_state(checkpoint: Path, pipeline: PipelineSettings, batch: int, read_state: StateReader | None,
               ) -> OldState | None:
    old = read_state(checkpoint, batch) if read_state is not None and _same_key(checkpoint, pipeline) else None
    if old is None:
        refusal = _table_alone_refusal(pipeline)
        if refusal is not None:
            raise ConfigError(f"pipeline {pipeline.name}: {refusal}, and the old checkpoint's state cannot be "
                              "used (not readable, or the materializer's key changed): its state cannot be "
                              "rebuilt from the table")
    return old


def rebuild_state(settings: Settings, name: str, now: datetime | None = None,
                  read_state: StateReader | None = None) -> RebuildReport:
    """Seed a new checkpoint of pipeline `name` from its Delta table; the old checkpoint is moved aside.

    `read_state` reads the old checkpoint's materializer state (`spark_state_reader`); None: the table alone."""
    pipeline = _pipeline(settings, name)
    checkpoint = _checkpoint(settings, pipeline)
    uri = settings.lakehouse.table_uri(pipeline.table)
    try:
        table = DeltaTable(uri, storage_options=settings.lakehouse.storage_options or None)
    except TableNotFoundError:
        raise ConfigError(f"pipeline {name}: no Delta table at {uri}: nothing to rebuild from") from None
    cut = _cut(checkpoint, pipeline, table)
    old = _old_state(checkpoint, pipeline, cut.batch, read_state)
    keys = pipeline.primary_key if old is not None else pipeline.primary_key + pipeline.effective_upsert_key
    _check_key_types(pa.schema(table.schema().to_arrow()), pipeline, keys)
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    moved = checkpoint.with_name(f"{checkpoint.name}{MOVED_SUFFIX}{stamp}")
    staged = checkpoint.with_name(f"{checkpoint.name}.rebuilding-{stamp}")
    try:
        counts = _write_seed(staged / SEED_DIR, table, pipeline, cut, old)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    checkpoint.rename(moved)
    staged.rename(checkpoint)
    return RebuildReport(name, uri, table.version(), cut, counts, checkpoint, moved, checkpoint)


def spark_state_reader(settings: Settings) -> StateReader:
    """Reads an old checkpoint's materializer state in a Spark session built from `settings` on first use."""
    def read(checkpoint: Path, batch: int) -> OldState | None:
        from service.runtime.spark_session import build_spark

        return read_old_state(build_spark(settings.spark), checkpoint, batch)
    return read
