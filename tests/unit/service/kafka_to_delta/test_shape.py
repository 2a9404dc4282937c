"""The ingest pipeline's shape, chosen from its compiled plan's operators."""

from __future__ import annotations

import pytest

from service.config.settings import settings_from_mapping
from service.kafka_to_delta.materialize.bucket_labels import spread_labels
from service.kafka_to_delta.pipeline import stage_config
from service.kafka_to_delta.plan.compiled_plan import (
    Kind,
    Operator,
    join_operators,
    pipeline_operators,
)
from service.kafka_to_delta.shape import Shape, pipeline_shape, shape_of

_BASE = {"topics": ["t"], "table": "t", "primary_key": ["id"]}
_PIPELINES = {
    "plain": {},
    "ordered": {"from_changelog": {"preset": "debezium", "order_by": "ts"}},
    "unzipped": {"from_changelog": {"preset": "debezium", "state_ttl_seconds": 60}},
    "two_topics": {"topics": ["a", "b"], "on_conflict": "deduplicate"},
    "forced": {"upsert_materialize": "force", "compaction": "watermark"},
    "ordered_materialized": {"upsert_materialize": "force",
                             "from_changelog": {"preset": "debezium", "order_by": "ts"}},
}


def _pipeline(name: str):
    config = {"name": name, **_BASE, **_PIPELINES[name]}
    return settings_from_mapping({"pipelines": [config]}).pipelines[0]


def test_each_pipeline_gets_the_shape_its_operators_call_for() -> None:
    shapes = {name: pipeline_shape(_pipeline(name)).name for name in _PIPELINES}
    assert shapes == {
        "plain": "plain",
        "ordered": "from_changelog",
        "unzipped": "from_changelog",
        "two_topics": "materializer_buckets",
        "forced": "materializer_buckets",
        "ordered_materialized": "materializer_buckets+from_changelog",
    }


def test_the_plain_path_has_no_operator_and_reduces_where_read() -> None:
    plain = pipeline_shape(_pipeline("plain"))
    assert pipeline_operators(_pipeline("plain")) == []
    assert plain == Shape()
    assert plain.reduces_where_read and not plain.reduces_per_batch and not plain.packed_buckets


def test_a_stateful_changelog_stage_without_materializer_reduces_per_batch() -> None:
    shape = pipeline_shape(_pipeline("unzipped"))
    assert shape.changelog_stage and shape.reduces_per_batch
    assert not shape.reduces_where_read and not shape.materializer


def test_the_bucket_stage_reads_packed_changes_unless_a_changelog_stage_is_in_front() -> None:
    alone = pipeline_shape(_pipeline("forced"), key_buckets=16)
    behind = pipeline_shape(_pipeline("ordered_materialized"), key_buckets=16)
    assert alone.packed_buckets and alone.materializer_declares_watermark and alone.key_buckets == 16
    assert not behind.packed_buckets and not behind.materializer_declares_watermark


def test_the_checkpoint_key_bucket_count_decides_between_key_and_bucket_stage() -> None:
    per_key = pipeline_shape(_pipeline("forced"), key_buckets=0)
    assert per_key.name == "materializer_keys" and not per_key.packed_buckets
    assert pipeline_shape(_pipeline("forced"), key_buckets=64).key_buckets == 64


def test_the_checkpoint_layout_decides_whether_the_buckets_are_spread() -> None:
    """A new checkpoint's buckets are spread; one begun with the bucket numbers keeps them; a count that is not
    a power of two cannot be spread (`bucket_labels`)."""
    assert pipeline_shape(_pipeline("forced")).spread_buckets
    assert not pipeline_shape(_pipeline("forced"), key_buckets=16, spread=False).spread_buckets
    assert not pipeline_shape(_pipeline("forced"), key_buckets=12).spread_buckets
    assert stage_config(_pipeline("forced")).bucket_labels == spread_labels(16)
    assert stage_config(_pipeline("forced"), 16, spread=False).bucket_labels is None


def test_watermark_compaction_comes_from_the_materializer_operator() -> None:
    assert pipeline_shape(_pipeline("forced")).watermark_compaction
    assert not pipeline_shape(_pipeline("two_topics")).watermark_compaction


def test_operators_that_are_not_an_ingest_pipelines_are_refused() -> None:
    join = settings_from_mapping({"joins": [{
        "name": "j", "type": "inner", "table": "out", "primary_key": ["l_id", "r_id"],
        "left": {"topics": ["l"], "primary_key": ["l_id"], "join_key": ["k"]},
        "right": {"topics": ["r"], "primary_key": ["r_id"], "join_key": ["k"]},
    }]}).joins[0]
    with pytest.raises(ValueError, match="not an ingest pipeline"):
        shape_of(join_operators(join))
    with pytest.raises(ValueError, match="no state layout"):
        shape_of([Operator("p", Kind.MATERIALIZER, ("id",), ())])
