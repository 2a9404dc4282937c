"""The compiled plan: every stateful operator of every pipeline, in JSON (spec: state-management-and-ttl).

`cdc-lakehouse plan CONFIG -o plan.json` writes it; `cdc-lakehouse run CONFIG --plan plan.json`
runs with the TTLs it holds (the plan wins over the config, as in the spec). Each node names one
operator: `id` (`<pipeline>/<kind>`), `kind`, `key` (the columns its state is keyed by) and
`state`, one entry per state it keeps, in the spec's shape
`{"index": 0, "ttl": "3600000 ms", "name": "image"}` ("0 ms": kept until the data removes it).
`properties` holds what else decides what the state means (on_conflict, compaction, ...): a
changed property is a changed operator (`plan_upgrade`).

Operators:
- `from_changelog`: the previous image per key of the upsert unzip (`from_changelog.state_ttl_seconds`).
- `order_by`: the ORDER BY buffer (rows wait for the watermark; no TTL: the watermark empties it).
- `materializer`: the live rows per upsert key (`materializer_state_ttl_seconds`, else `state_ttl_seconds`).
- `table_shape`: no state; the table's `deletes` mode, `ignore_null_updates` and layout (`partition_by`,
  `cluster_by`), listed when they differ from the default, which its absence stands for.
- `columns`: no state; the pipeline's `columns:` (include / exclude, `computed.<name>` expressions, filter,
  masked columns and a fingerprint of the salt, never the salt), listed when the pipeline has the block.
A pipeline on the plain path (one topic, no materializer, no stateful FROM_CHANGELOG) has none.

Join pipelines (`joins:`):
- `join`: a regular join keyed by the join key, with a `left` and a `right` state (each side's
  rows by its primary key; `left_state_ttl_seconds` / `right_state_ttl_seconds`), then the
  output's `materializer` keyed by the pair of input keys;
- `snapshot_gate`: the gate of an enrichment join (the build side's snapshot progress per
  partition, and the probe records held back while it is closed; no TTL);
- `enrichment`: the latest build row per build key (`state_ttl_seconds`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.config.columns import ColumnSettings
from service.config.joins import EnrichmentJoinSettings, JoinSettings, RegularJoinSettings
from service.config.settings import PipelineSettings, Settings
from service.config.sources import mask_salt_if_set, read_plan_file
from service.config.table_shape import TableShape
from service.kafka_to_delta.materialize.bucket_labels import spreads
from service.kafka_to_delta.materialize.bulk import DEFAULT_KEY_BUCKETS
from vocabulary.errors import ConfigError

PLAN_FORMAT = 1
_BUCKETS_LAYOUT = "key buckets: "
_SPREAD_LAYOUT = "spread key buckets: "
_PER_KEY_LAYOUT = "per key"
_MS_PER_S = 1000
_TTL_UNIT = " ms"
_WHOLE_ROW = ["(whole row)"]
# Bytes of state per key besides the row images, measured (bench/README.md, materializer benchmark).
_OVERHEAD_BYTES = {"from_changelog": 60, "order_by": 40, "materializer": 75, "join": 75, "snapshot_gate": 40,
                   "enrichment": 60}


class Kind:
    """Operator kinds."""

    FROM_CHANGELOG = "from_changelog"
    ORDER_BY = "order_by"
    MATERIALIZER = "materializer"
    JOIN = "join"
    SNAPSHOT_GATE = "snapshot_gate"
    ENRICHMENT = "enrichment"
    HISTORY = "history"
    TABLE_SHAPE = "table_shape"
    COLUMNS = "columns"


@dataclass(frozen=True)
class StateEntry:
    """One state of an operator."""

    index: int
    ttl_ms: int
    name: str

    def as_json(self) -> dict[str, Any]:
        return {"index": self.index, "ttl": f"{self.ttl_ms}{_TTL_UNIT}", "name": self.name}


@dataclass(frozen=True)
class Operator:
    """One stateful operator of one pipeline."""

    pipeline: str
    kind: str
    key: tuple[str, ...]
    state: tuple[StateEntry, ...]
    properties: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.pipeline}/{self.kind}"

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "pipeline": self.pipeline, "kind": self.kind, "key": list(self.key),
                "state": [entry.as_json() for entry in self.state], "properties": self.properties}


def _ms(seconds: float | None) -> int:
    return int(round((seconds or 0) * _MS_PER_S))


def _group_key(pipeline: PipelineSettings) -> tuple[str, ...]:
    columns = pipeline.from_changelog.partition_by or pipeline.effective_upsert_key
    return ("topic", *(columns or _WHOLE_ROW))


def state_layout(key_buckets: int, spread: bool = False) -> str:
    """How the materializer holds its state: per key bucket (how many; `spread`: each under its label spread
    over the shuffle partitions, `materialize.bucket_labels`) or per key."""
    if not key_buckets:
        return _PER_KEY_LAYOUT
    return f"{_SPREAD_LAYOUT if spread else _BUCKETS_LAYOUT}{key_buckets}"


def key_buckets_of(layout: object) -> int | None:
    """The key bucket count a `state_layout` names (0: per key); None when it names none."""
    if layout == _PER_KEY_LAYOUT:
        return 0
    for prefix in (_BUCKETS_LAYOUT, _SPREAD_LAYOUT):
        if isinstance(layout, str) and layout.startswith(prefix) and layout[len(prefix):].isdigit():
            return int(layout[len(prefix):])
    return None


def spread_of(layout: object) -> bool:
    """Whether a `state_layout` keeps its buckets under spread labels."""
    return isinstance(layout, str) and layout.startswith(_SPREAD_LAYOUT) and key_buckets_of(layout) is not None


def pipeline_operators(pipeline: PipelineSettings, key_buckets: int = DEFAULT_KEY_BUCKETS,
                       spread: bool = True) -> list[Operator]:
    """The stateful operators of one pipeline, in data-flow order (`key_buckets` and `spread`: its
    checkpoint's state layout, see `plan_upgrade.stored_bucket_layout`)."""
    operators = []
    changelog = pipeline.from_changelog
    if changelog.order_by is not None:
        operators.append(Operator(pipeline.name, Kind.ORDER_BY, _group_key(pipeline), (StateEntry(0, 0, "buffer"),),
                                  {"order_by": changelog.order_by,
                                   "watermark_delay": f"{_ms(changelog.watermark_delay_seconds)}{_TTL_UNIT}"}))
    if changelog.stateful:
        operators.append(Operator(pipeline.name, Kind.FROM_CHANGELOG, _group_key(pipeline),
                                  (StateEntry(0, _ms(changelog.state_ttl_seconds), "image"),)))
    if pipeline.materialized:
        key = pipeline.effective_upsert_key or tuple(_WHOLE_ROW)
        if len(pipeline.topics) > 1:
            key = ("topic", *key)
        operators.append(Operator(
            pipeline.name, Kind.MATERIALIZER, key, (StateEntry(0, _ms(pipeline.materializer_ttl_seconds), "rows"),),
            {"on_conflict": pipeline.on_conflict or "error", "compaction": pipeline.effective_compaction,
             "primary_key": list(pipeline.primary_key), "sequence_by": list(pipeline.sequence_by),
             "topics": sorted(pipeline.topics),
             "state_layout": state_layout(key_buckets, spread and spreads(key_buckets))},
        ))
    if pipeline.history is not None:
        table = pipeline.history.table_for(pipeline.table)
        operators.append(Operator(pipeline.name, Kind.HISTORY, pipeline.primary_key,
                                  (StateEntry(0, 0, f"versions in table {table}"),),
                                  pipeline.history.plan_properties(pipeline.table, pipeline.history_sequence_by)))
    if pipeline.table_shape != TableShape():
        operators.append(table_shape_operator(pipeline.name, pipeline.table_shape))
    if pipeline.columns is not None:
        operators.append(columns_operator(pipeline.name, pipeline.columns,
                                          mask_salt_if_set(pipeline.columns.salt_env)))
    return operators


def columns_operator(pipeline: str, columns: ColumnSettings, salt: str | None) -> Operator:
    """A pipeline's `columns:` as a plan node without state (`salt`: as read from the environment, or None);
    a plan without the node stands for no `columns:` block."""
    return Operator(pipeline, Kind.COLUMNS, (), (), columns.plan_properties(salt))


def table_shape_operator(pipeline: str, shape: TableShape) -> Operator:
    """The table shape of a pipeline as a plan node without state: listed when it differs from the
    default (hard deletes, nulls overwrite, no layout), which a plan without the node stands for."""
    return Operator(pipeline, Kind.TABLE_SHAPE, (), (), shape.plan_properties())


def _regular_join_operators(join: RegularJoinSettings) -> list[Operator]:
    sides = {"left_key": list(join.left.primary_key), "right_key": list(join.right.primary_key),
             "right_join_key": list(join.right.join_key)}
    return [
        Operator(join.name, Kind.JOIN, join.left.join_key,
                 (StateEntry(0, _ms(join.left_ttl_seconds), "left"), StateEntry(1, _ms(join.right_ttl_seconds), "right")),
                 {"type": join.type, **sides}),
        Operator(join.name, Kind.MATERIALIZER, join.left.primary_key + join.right.primary_key,
                 (StateEntry(0, _ms(join.state_ttl_seconds), "rows"),),
                 {"on_conflict": join.on_conflict, "primary_key": list(join.primary_key)}),
    ]


def _enrichment_operators(join: EnrichmentJoinSettings) -> list[Operator]:
    gate = [Operator(join.name, Kind.SNAPSHOT_GATE, ("topic", "partition"),
                     (StateEntry(0, 0, "snapshot_progress"), StateEntry(1, 0, "held_probes")),
                     {"build_topics": sorted(join.right.topics)})] if join.gate else []
    return gate + [Operator(join.name, Kind.ENRICHMENT, join.right.join_key,
                            (StateEntry(0, _ms(join.state_ttl_seconds), "build"),),
                            {"type": join.type, "probe_key": list(join.left.primary_key), "missing": join.missing})]


def join_operators(join: JoinSettings) -> list[Operator]:
    """The stateful operators of one join pipeline, in data-flow order."""
    if isinstance(join, RegularJoinSettings):
        return _regular_join_operators(join)
    return _enrichment_operators(join)


def compile_plan(settings: Settings) -> dict[str, Any]:
    """The plan of every pipeline and join as a JSON-ready document."""
    nodes = [op.as_json() for pipeline in settings.pipelines for op in pipeline_operators(pipeline)]
    nodes += [op.as_json() for join in settings.joins for op in join_operators(join)]
    names = [p.name for p in settings.pipelines] + [j.name for j in settings.joins]
    return {"cdc_lakehouse_plan": PLAN_FORMAT, "pipelines": names, "nodes": nodes}


def _ttl_ms(text: Any, where: str) -> int:
    if not isinstance(text, str) or not text.endswith(_TTL_UNIT) or not text[: -len(_TTL_UNIT)].strip().isdigit():
        raise ConfigError(f"{where}: ttl must look like '3600000 ms', not {text!r}")
    return int(text[: -len(_TTL_UNIT)])


def read_plan(path: str | Path) -> dict[str, Any]:
    """A plan file, checked for its shape; errors name the file."""
    plan = read_plan_file(path)
    if not isinstance(plan, dict) or plan.get("cdc_lakehouse_plan") != PLAN_FORMAT or not isinstance(
        plan.get("nodes"), list
    ):
        raise ConfigError(f"{path}: not a cdc-lakehouse plan (format {PLAN_FORMAT} with a 'nodes' list)")
    for node in plan["nodes"]:
        where = f"{path}: operator {node.get('id')!r}" if isinstance(node, dict) else f"{path}: a node"
        if not isinstance(node, dict) or not isinstance(node.get("state"), list):
            raise ConfigError(f"{where} has no 'state' list")
        for entry in node["state"]:
            _ttl_ms(entry.get("ttl") if isinstance(entry, dict) else None, where)
    return plan


def _node_ttls(node: dict[str, Any], where: str) -> dict[str, int]:
    return {entry["name"]: _ttl_ms(entry["ttl"], where) for entry in node["state"]}


def _planned_ttls(planned: dict[str, Any], operators: list[Operator], source: str) -> dict[str, dict[str, int]]:
    """Per operator kind, the plan's TTLs (ms) by state name; the plan's node is taken out of `planned`."""
    found: dict[str, dict[str, int]] = {}
    for operator in operators:
        node = planned.pop(operator.id, None)
        where = f"{source}: operator {operator.id!r}"
        if node is None:
            raise ConfigError(f"{where} of the config is not in the plan: compile the plan again")
        if node.get("kind") != operator.kind or list(node.get("key") or []) != list(operator.key):
            raise ConfigError(f"{where}: the plan has kind {node.get('kind')!r} keyed by {node.get('key')}, "
                              f"the config {operator.kind!r} keyed by {list(operator.key)}")
        found[operator.kind] = _node_ttls(node, where)
    return found


def _pipeline_with_plan(pipeline: PipelineSettings, ttls: dict[str, dict[str, int]]) -> PipelineSettings:
    update: dict[str, Any] = {}
    if "image" in ttls.get(Kind.FROM_CHANGELOG, {}):
        update["from_changelog"] = pipeline.from_changelog.model_copy(
            update={"state_ttl_seconds": ttls[Kind.FROM_CHANGELOG]["image"] / _MS_PER_S})
    if "rows" in ttls.get(Kind.MATERIALIZER, {}):
        update["materializer_state_ttl_seconds"] = ttls[Kind.MATERIALIZER]["rows"] / _MS_PER_S
    return pipeline.model_copy(update=update) if update else pipeline


def _join_with_plan(join: JoinSettings, ttls: dict[str, dict[str, int]]) -> JoinSettings:
    update: dict[str, Any] = {}
    sides = ttls.get(Kind.JOIN, {})
    for side in ("left", "right"):
        if side in sides:
            update[f"{side}_state_ttl_seconds"] = sides[side] / _MS_PER_S
    rows = ttls.get(Kind.MATERIALIZER, {}).get("rows", ttls.get(Kind.ENRICHMENT, {}).get("build"))
    if rows is not None:
        update["state_ttl_seconds"] = rows / _MS_PER_S
    return join.model_copy(update=update) if update else join


def apply_plan(settings: Settings, plan: dict[str, Any], source: str = "plan") -> Settings:
    """The settings with the plan's TTLs; a plan whose operators differ from the config's is refused
    naming the operator."""
    planned = {node.get("id"): node for node in plan["nodes"]}
    pipelines = tuple(_pipeline_with_plan(p, _planned_ttls(planned, pipeline_operators(p), source))
                      for p in settings.pipelines)
    joins = tuple(_join_with_plan(j, _planned_ttls(planned, join_operators(j), source)) for j in settings.joins)
    if planned:
        extra = sorted(str(name) for name in planned)
        raise ConfigError(f"{source}: operator(s) {extra} of the plan are not in the config's pipelines")
    return settings.model_copy(update={"pipelines": pipelines, "joins": joins})


def _ttl_text(ms: int) -> str:
    if ms == 0:
        return "none (kept until the data removes it)"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms} ms"


def _state_size(operator: Operator) -> str:
    if operator.kind == Kind.HISTORY:
        return f"none in Spark: every version of a key in table {operator.properties.get('history_table')}"
    if operator.kind == Kind.TABLE_SHAPE:
        return "none (how the table is written and laid out)"
    if operator.kind == Kind.COLUMNS:
        return "none (which rows and columns are written, computed and masked)"
    overhead = _OVERHEAD_BYTES[operator.kind]
    if operator.kind == Kind.ORDER_BY:
        return f"the rows within the watermark delay, ~{overhead} B each beyond the row"
    if operator.kind == Kind.SNAPSHOT_GATE:
        return f"~{overhead} B per build partition, plus the probe records held while the gate is closed"
    if operator.kind == Kind.JOIN:
        return f"the input rows of each side with this key, ~{overhead} B each beyond the row"
    images = 1
    if operator.kind == Kind.MATERIALIZER and operator.properties.get("on_conflict") == "deduplicate":
        images = max(2, len(operator.properties.get("topics", [])))  # one live row per source
    extra = " (+ a tombstone per deleted key)" if operator.properties.get("sequence_by") else ""
    return f"~{images} row image{'s' if images > 1 else ''} + {overhead} B per key{extra}"


def summary(settings: Settings) -> list[str]:
    """Human-readable lines: per pipeline, its operators, keys, TTLs and state size per key."""
    lines = []
    entries = [(p.name, pipeline_operators(p)) for p in settings.pipelines]
    entries += [(j.name, join_operators(j)) for j in settings.joins]
    for name, operators in entries:
        if not operators:
            lines.append(f"pipeline {name}: no state (last change per key per micro-batch)")
            continue
        lines.append(f"pipeline {name}:")
        for operator in operators:
            ttls = ", ".join(f"{e.name} {_ttl_text(e.ttl_ms)}" for e in operator.state)
            if operator.kind == Kind.ORDER_BY:
                ttls = "none (the watermark releases the buffer)"
            if operator.kind == Kind.HISTORY:
                ttls = "none (versions are kept)"
            if operator.kind in (Kind.TABLE_SHAPE, Kind.COLUMNS):
                ttls = "none"
            shown = ", ".join(f"{k}={v}" for k, v in operator.properties.items() if k not in ("topics", "state_layout"))
            lines.append(f"  {operator.id:<32} key ({', '.join(operator.key)}); TTL {ttls}; "
                         f"state {_state_size(operator)}" + (f"; {shown}" if shown else ""))
    return lines
