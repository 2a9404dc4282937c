"""The ingest pipeline's shape, chosen in one place from the stateful operators of its compiled plan.

`plan.compiled_plan.pipeline_operators` lists every stateful operator a pipeline runs; the shape of
its streaming query follows from that list alone:

- no operator: the plain path. Each Kafka range is decoded and reduced to its net changes where it
  is read (`source.partition_changes`); the driver merges the ranges.
- `order_by` and/or `from_changelog`: a stateful FROM_CHANGELOG stage (`changelog.stage`) runs on
  the decoded rows and declares the query's watermark; without a materializer the batch is then
  reduced to one net change per key (`materialize.net_changes`).
- `history` (an SCD type 2 history table, `sink.history_sink`): the shape does not change. On the plain
  path each range hands over every row change it read, typed, besides its net changes
  (`source.history_rows`); behind a stateful FROM_CHANGELOG stage the history takes the batch's
  changelog rows before the reduction.
- `materializer`: the keyed-state materializer, per key (`state_layout` "per key") or per key bucket.
  The bucket stage reads the decoded changes packed per bucket where they are read, unless a
  stateful FROM_CHANGELOG stage in front hands it one row per change.

The ingest pipeline asks this module and hands the stages what it says (the materializer's key
bucket count, who declares the watermark); no stage decides the shape from settings on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from service.config.settings import PipelineSettings
from service.kafka_to_delta.materialize.bulk import DEFAULT_KEY_BUCKETS
from service.kafka_to_delta.plan.compiled_plan import (
    Kind,
    Operator,
    key_buckets_of,
    pipeline_operators,
    spread_of,
)

_CHANGELOG_KINDS = frozenset({Kind.ORDER_BY, Kind.FROM_CHANGELOG})
_INGEST_KINDS = _CHANGELOG_KINDS | {Kind.MATERIALIZER, Kind.HISTORY, Kind.TABLE_SHAPE, Kind.COLUMNS}


@dataclass(frozen=True)
class Shape:
    """What an ingest pipeline's streaming query is made of."""

    changelog_stage: bool = False  # a stateful FROM_CHANGELOG stage (ORDER BY, upsert unzip)
    materializer: bool = False
    key_buckets: int = 0  # the materializer's state per key bucket (how many); 0: per key
    spread_buckets: bool = False  # the buckets' states under labels spread over the shuffle partitions
    watermark_compaction: bool = False  # the materializer compacts when the watermark passes
    history: bool = False  # a history table is written from every change of a batch (the ranges hand them over)

    @property
    def name(self) -> str:
        """'plain', 'from_changelog', 'materializer_keys' or 'materializer_buckets', with
        '+from_changelog' when a stateful FROM_CHANGELOG stage runs in front of a materializer."""
        if not self.materializer:
            return "from_changelog" if self.changelog_stage else "plain"
        name = "materializer_buckets" if self.key_buckets else "materializer_keys"
        return f"{name}+from_changelog" if self.changelog_stage else name

    @property
    def reduces_where_read(self) -> bool:
        """The plain path: ranges decoded and reduced to net changes where they are read."""
        return not self.changelog_stage and not self.materializer

    @property
    def packed_buckets(self) -> bool:
        """The decoded changes leave their read task packed per key bucket (the bucket stage reads them)."""
        return self.materializer and bool(self.key_buckets) and not self.changelog_stage

    @property
    def reduces_per_batch(self) -> bool:
        """The batch's changelog rows are reduced to net changes by the query (no materializer)."""
        return self.changelog_stage and not self.materializer

    @property
    def materializer_declares_watermark(self) -> bool:
        """The materializer declares the query's watermark (no stateful FROM_CHANGELOG stage in front,
        which would declare it)."""
        return self.materializer and not self.changelog_stage


def shape_of(operators: Sequence[Operator]) -> Shape:
    """The shape of an ingest pipeline whose compiled plan lists `operators` (a join's are refused)."""
    kinds = {operator.kind for operator in operators}
    unknown = kinds - _INGEST_KINDS
    if unknown:
        raise ValueError(f"not an ingest pipeline's operators: {sorted(unknown)}")
    materializer = next((op for op in operators if op.kind == Kind.MATERIALIZER), None)
    history = Kind.HISTORY in kinds
    if materializer is None:
        return Shape(changelog_stage=bool(kinds & _CHANGELOG_KINDS), history=history)
    layout = materializer.properties.get("state_layout")
    buckets = key_buckets_of(layout)
    if buckets is None:
        raise ValueError(f"operator {materializer.id}: no state layout")
    return Shape(
        changelog_stage=bool(kinds & _CHANGELOG_KINDS), materializer=True, key_buckets=buckets,
        spread_buckets=spread_of(layout),
        watermark_compaction=materializer.properties.get("compaction") == "watermark", history=history,
    )


def pipeline_shape(pipeline: PipelineSettings, key_buckets: int = DEFAULT_KEY_BUCKETS, spread: bool = True) -> Shape:
    """The shape of one ingest pipeline (`key_buckets`, `spread`: its checkpoint's state layout,
    `plan.upgrades.stored_bucket_layout`)."""
    return shape_of(pipeline_operators(pipeline, key_buckets, spread))
