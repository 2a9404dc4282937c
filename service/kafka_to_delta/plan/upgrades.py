"""Stateful upgrades: a checkpoint remembers the plan it was started with (`compiled_plan`).

On every start of a pipeline, its operators are compared with the plan stored next to its
checkpoint (`<checkpoint>/plan.json`) before anything runs:
- compatible: a changed TTL, a changed watermark delay, a topic added to a materialized
  pipeline, a new pipeline (no checkpoint yet): the start goes ahead, the change is logged;
- incompatible: a changed key, an operator added to or removed from a pipeline whose
  checkpoint has started, a changed on_conflict, compaction, primary key, sequence_by, order_by
  column, state layout (the materializer's key buckets), join type or a join input's key, the history's
  mode, table, sequence, tracked columns or delete markers, the table shape's `deletes` mode, `partition_by` or
  `cluster_by`: refused, naming the operator and the change and how to proceed (for an ingest pipeline's
  materializer: `rebuild-state`; for a history: a new history table; for a table shape: a new table).
  A plan without a `table_shape` node stands for the default shape (`ignore_null_updates` may change).
- `columns`: a changed include / exclude list, filter, mask or salt is refused (the rows written before
  would not match the new rule; for a new table); a computed column may be added (rows written before hold
  null in it until their key changes), not changed or removed. A plan without the node stands for none.
Then the current plan is stored. A checkpoint from before plans were stored is taken as it is.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from service.config.columns import ColumnSettings
from service.config.settings import PipelineSettings
from service.config.table_shape import TableShape
from service.kafka_to_delta.materialize.bulk import DEFAULT_KEY_BUCKETS, LEGACY_KEY_BUCKETS
from service.kafka_to_delta.plan.compiled_plan import (
    PLAN_FORMAT,
    Kind,
    Operator,
    columns_operator,
    key_buckets_of,
    pipeline_operators,
    spread_of,
    table_shape_operator,
)
from service.runtime.checkpoints import local_path
from vocabulary.errors import ConfigError

log = logging.getLogger(__name__)
PLAN_FILE = "plan.json"
INCOMPATIBLE_PROPERTIES = ("on_conflict", "compaction", "primary_key", "sequence_by", "order_by", "state_layout",
                           "type", "left_key", "right_key", "right_join_key", "probe_key", "build_topics",
                           "history_mode", "history_table", "history_sequence_by", "track_history_column_list",
                           "track_history_except_column_list", "delete_markers", "deletes", "partition_by",
                           "cluster_by", "include", "exclude", "filter", "mask", "salt")
COMPUTED_PREFIX = "computed."
_HOW_TO_PROCEED = (
    "the state in the checkpoint was built under the stored plan and cannot be carried over. To proceed, move "
    "the checkpoint directory away and start a new one: with starting_offsets earliest the pipeline replays "
    "the topics and rebuilds its state (the MERGEs are idempotent), or from a chosen offset when the topics "
    "no longer hold everything the state needs"
)
_REBUILD_HISTORY = (
    ". For the history table, whose versions were cut under the stored settings: write the history under the "
    "new settings to a new table (`history.table`) from a new checkpoint with starting_offsets earliest while "
    "the topics still hold every change, or build it yourself from the current table's change feed (which "
    "holds each micro-batch's last change per key, not every change), then switch readers over"
)
_RESHAPE_TABLE = (
    ". For the table, which was written and laid out under the stored table_shape: write the pipeline under "
    "the new table_shape to a new table (`table`) from a new checkpoint with starting_offsets earliest while "
    "the topics still hold every change (soft deletes need every delete), or rewrite the table yourself "
    "(e.g. delta-spark's REPLACE TABLE ... PARTITIONED BY / CLUSTER BY ... AS SELECT) before moving the "
    "checkpoint away, then switch readers over"
)
_RECOLUMN_TABLE = (
    ". For the table, whose rows were selected, computed and masked under the stored columns settings: write "
    "the pipeline under the new settings to a new table (`table`) from a new checkpoint with starting_offsets "
    "earliest while the topics still hold every change, then switch readers over (a new salt or mask cannot "
    "be applied to values already hashed)"
)
_REBUILD = (
    ". For the materializer, without a replay: stop the service and run `cdc-lakehouse rebuild-state CONFIG "
    "--pipeline {pipeline}`, which moves this checkpoint aside and seeds a new one from the Delta table"
)


def _started(checkpoint: Path) -> bool:
    offsets = checkpoint / "offsets"
    return offsets.is_dir() and any(p.name.isdigit() for p in offsets.iterdir())


def _default_shapes(stored: dict[str, dict[str, Any]], current: dict[str, dict[str, Any]]) -> None:
    """A `table_shape` node on one side only: the other side's default shape put in its place."""
    for one, other in ((stored, current), (current, stored)):
        for name, node in other.items():
            if node.get("kind") == Kind.TABLE_SHAPE and name not in one:
                one[name] = table_shape_operator(node.get("pipeline", ""), TableShape()).as_json()
            if node.get("kind") == Kind.COLUMNS and name not in one:
                one[name] = columns_operator(node.get("pipeline", ""), ColumnSettings(), None).as_json()


def _changes(stored: dict[str, dict[str, Any]], current: dict[str, dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(incompatible changes, compatible ones), each as a sentence naming the operator."""
    stored, current = dict(stored), dict(current)
    _default_shapes(stored, current)
    refused: list[str] = []
    allowed: list[str] = []
    for name in sorted(current.keys() - stored.keys()):
        refused.append(f"operator {name!r} was added")
    for name in sorted(stored.keys() - current.keys()):
        refused.append(f"operator {name!r} was removed")
    for name in sorted(current.keys() & stored.keys()):
        old, new = stored[name], current[name]
        if old.get("key") != new.get("key"):
            refused.append(f"operator {name!r}: key changed from {old.get('key')} to {new.get('key')}")
        old_props, new_props = old.get("properties") or {}, new.get("properties") or {}
        for prop in sorted(old_props.keys() | new_props.keys()):
            if old_props.get(prop) == new_props.get(prop):
                continue
            sentence = f"operator {name!r}: {prop} changed from {old_props.get(prop)!r} to {new_props.get(prop)!r}"
            changed_computed = prop.startswith(COMPUTED_PREFIX) and old_props.get(prop) is not None
            (refused if prop in INCOMPATIBLE_PROPERTIES or changed_computed else allowed).append(sentence)
        old_ttls = {e.get("name"): e.get("ttl") for e in old.get("state") or []}
        for entry in new.get("state") or []:
            before = old_ttls.get(entry["name"])
            if before != entry["ttl"]:
                allowed.append(f"operator {name!r}: {entry['name']} TTL changed from {before} to {entry['ttl']}")
    return refused, allowed


def started_plan_nodes(checkpoint_dir: str) -> list[dict[str, Any]]:
    """The nodes of the plan stored in a started local checkpoint ([] for a new or remote one, or none stored)."""
    checkpoint = local_path(checkpoint_dir)
    if checkpoint is None or not (checkpoint / PLAN_FILE).exists() or not _started(checkpoint):
        return []
    try:
        return list(json.loads((checkpoint / PLAN_FILE).read_text())["nodes"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"the stored plan {checkpoint / PLAN_FILE} cannot be read ({error})") from None


def _rebuildable(pipeline: str, operators: list[Operator], refused: list[str]) -> bool:
    """Whether `rebuild-state` answers the refusal: an ingest pipeline keeps a materializer and it changed."""
    materializer = f"{pipeline}/{Kind.MATERIALIZER}"
    kinds = {op.kind for op in operators}
    return Kind.MATERIALIZER in kinds and Kind.JOIN not in kinds and any(materializer in c for c in refused)


def stored_bucket_layout(pipeline: str, checkpoint_dir: str) -> tuple[int, bool]:
    """The materializer's key bucket count for a pipeline's checkpoint, and whether its buckets are spread
    (`materialize.bucket_labels`): its state's layout.

    DEFAULT_KEY_BUCKETS, spread, for a checkpoint that holds no state yet (or whose stored plan has no
    materializer); for a started one, what its stored plan names, or LEGACY_KEY_BUCKETS by their numbers
    without a stored plan; the same for one that is not local (no plan is stored there).
    """
    checkpoint = local_path(checkpoint_dir)
    if checkpoint is None:
        return LEGACY_KEY_BUCKETS, False
    if not _started(checkpoint):
        return DEFAULT_KEY_BUCKETS, True
    path = checkpoint / PLAN_FILE
    if not path.exists():
        return LEGACY_KEY_BUCKETS, False
    try:
        nodes = json.loads(path.read_text())["nodes"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"pipeline {pipeline}: the stored plan {path} cannot be read ({error})") from None
    materializer = f"{pipeline}/{Kind.MATERIALIZER}"
    for node in nodes:
        if isinstance(node, dict) and node.get("id") == materializer:
            layout = (node.get("properties") or {}).get("state_layout")
            count = key_buckets_of(layout)
            if count is not None:
                return count, spread_of(layout)
    return DEFAULT_KEY_BUCKETS, True


def check_and_store_pipeline(pipeline: PipelineSettings, checkpoint_dir: str) -> None:
    """`check_and_store` for an ingest pipeline, its materializer laid out as its checkpoint's."""
    buckets, spread = stored_bucket_layout(pipeline.name, checkpoint_dir)
    check_and_store(pipeline.name, checkpoint_dir, pipeline_operators(pipeline, buckets, spread))


def check_and_store(pipeline: str, checkpoint_dir: str, operators: list[Operator]) -> None:
    """Refuse an incompatible upgrade of the checkpoint's plan (`ConfigError`), then store the current one."""
    checkpoint = local_path(checkpoint_dir)
    if checkpoint is None:
        log.warning("pipeline %s: checkpoint %s is not local: its plan is not stored or compared", pipeline,
                    checkpoint_dir)
        return
    path = checkpoint / PLAN_FILE
    current = {op.id: op.as_json() for op in operators}
    if path.exists() and _started(checkpoint):
        try:
            stored = {node["id"]: node for node in json.loads(path.read_text())["nodes"]}
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ConfigError(f"pipeline {pipeline}: the stored plan {path} cannot be read ({error})") from None
        refused, allowed = _changes(stored, current)
        if refused:
            rebuild = _REBUILD.format(pipeline=pipeline) if _rebuildable(pipeline, operators, refused) else ""
            if any(f"{pipeline}/{Kind.HISTORY}" in change for change in refused):
                rebuild += _REBUILD_HISTORY
            if any(f"{pipeline}/{Kind.TABLE_SHAPE}" in change for change in refused):
                rebuild += _RESHAPE_TABLE
            if any(f"{pipeline}/{Kind.COLUMNS}" in change for change in refused):
                rebuild += _RECOLUMN_TABLE
            raise ConfigError(f"pipeline {pipeline}: incompatible change to the plan of checkpoint {checkpoint}: "
                              f"{'; '.join(refused)}. {_HOW_TO_PROCEED}{rebuild}")
        for change in allowed:
            log.info("pipeline %s: compatible plan change: %s", pipeline, change)
    checkpoint.mkdir(parents=True, exist_ok=True)
    document = {"cdc_lakehouse_plan": PLAN_FORMAT, "pipelines": [pipeline], "nodes": list(current.values())}
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(document, indent=2))
    temporary.replace(path)
