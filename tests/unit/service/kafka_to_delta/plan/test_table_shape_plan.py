"""`table_shape:` in the configuration, the compiled plan and the upgrade check."""

from __future__ import annotations

from typing import Any

import pytest

from service.config.settings import PipelineSettings, settings_from_mapping
from service.kafka_to_delta.plan.compiled_plan import Kind, pipeline_operators, summary
from service.kafka_to_delta.plan.upgrades import check_and_store_pipeline
from tests.support.started_pipeline import start_pipeline
from vocabulary.errors import ConfigError


def _pipeline(engine: str = "delta-rs", **extra: Any) -> PipelineSettings:
    pipeline = {"name": "people", "topics": ["people"], "table": "people", "primary_key": ["id"], **extra}
    return settings_from_mapping({"lakehouse": {"engine": engine}, "pipelines": [pipeline]}).pipelines[0]


@pytest.mark.parametrize(("engine", "shape", "extra", "reason"), [
    ("delta-rs", {"cluster_by": ["region"]}, {}, "delta-rs engine cannot create a table with liquid clustering"),
    ("delta-spark", {"cluster_by": ["a"], "partition_by": ["b"]}, {}, "not both"),
    ("delta-spark", {"partition_by": ["a", "a"]}, {}, "names a column twice"),
    ("delta-spark", {"partition_by": ["__DELETED"]}, {}, "soft deletes' own columns"),
    ("delta-rs", {"deletes": "soft"}, {"from_changelog": {"truncate_handling": "truncate"}},
     "deletes: soft cannot be combined with truncate_handling: truncate"),
    ("delta-rs", {"deletes": "sometimes"}, {}, "hard"),
])
def test_what_a_table_shape_cannot_be_is_refused_naming_the_pipeline(engine, shape, extra, reason):
    with pytest.raises(ConfigError, match=reason) as refused:
        _pipeline(engine, table_shape=shape, **extra)
    assert "people" in str(refused.value) or "table_shape" in str(refused.value)


def test_the_default_shape_adds_no_plan_node_and_a_chosen_one_is_shown():
    assert pipeline_operators(_pipeline()) == []
    pipeline = _pipeline("delta-spark", table_shape={"deletes": "soft", "cluster_by": ["region"]})
    [operator] = pipeline_operators(pipeline)
    assert operator.kind == Kind.TABLE_SHAPE and operator.state == ()
    assert operator.properties == {"deletes": "soft", "ignore_null_updates": False, "partition_by": [],
                                   "cluster_by": ["region"]}
    settings = settings_from_mapping({"lakehouse": {"engine": "delta-spark"}, "pipelines": [pipeline.model_dump()]})
    line = next(line for line in summary(settings) if "people/table_shape" in line)
    assert "deletes=soft" in line and "cluster_by=['region']" in line


@pytest.mark.parametrize(("before", "after", "change"), [
    ({}, {"deletes": "soft"}, "deletes changed from 'hard' to 'soft'"),
    ({"deletes": "soft"}, {}, "deletes changed from 'soft' to 'hard'"),
    ({"partition_by": ["a"]}, {"partition_by": ["b"]}, "partition_by changed from ['a'] to ['b']"),
    ({}, {"partition_by": ["a"]}, "partition_by changed from [] to ['a']"),
])
def test_changing_deletes_or_the_layout_of_a_started_pipeline_is_refused_with_the_way_forward(
        tmp_path, before, after, change):
    start_pipeline(tmp_path, _pipeline(table_shape=before))
    with pytest.raises(ConfigError) as refused:
        check_and_store_pipeline(_pipeline(table_shape=after), str(tmp_path / "people"))
    message = str(refused.value)
    assert "people/table_shape" in message and change in message
    assert "new table (`table`)" in message


@pytest.mark.parametrize(("before", "after"), [({}, {"ignore_null_updates": True}), ({"ignore_null_updates": True}, {}),
                                               ({"deletes": "soft"}, {"deletes": "soft"})])
def test_ignore_null_updates_may_change_and_the_same_shape_restarts(tmp_path, before, after):
    start_pipeline(tmp_path, _pipeline(table_shape=before))
    check_and_store_pipeline(_pipeline(table_shape=after), str(tmp_path / "people"))


def test_deletion_vectors_are_shown_and_may_be_turned_on_for_a_started_pipeline(tmp_path):
    """Shown in the plan when on (a plan stored before the option existed compares equal when off); the
    upgrade check lets it change (the table's own properties decide: the sink refuses a table without them)."""
    pipeline = _pipeline(table_shape={"deletion_vectors": True})
    [operator] = pipeline_operators(pipeline)
    assert operator.properties["deletion_vectors"] is True
    assert pipeline.table_shape.table_properties() == {"delta.enableDeletionVectors": "true"}
    assert _pipeline(table_shape={"deletion_vectors": False}).table_shape.table_properties() == {}
    assert pipeline_operators(_pipeline(table_shape={"deletion_vectors": False})) == []
    start_pipeline(tmp_path, _pipeline())
    check_and_store_pipeline(pipeline, str(tmp_path / "people"))
