"""`history:` in the configuration, the compiled plan, the pipeline's shape and the upgrade check."""

from __future__ import annotations

from typing import Any

import pytest

from service.config.settings import PipelineSettings, settings_from_mapping
from service.kafka_to_delta.plan.compiled_plan import Kind, pipeline_operators, summary
from service.kafka_to_delta.plan.upgrades import check_and_store_pipeline
from service.kafka_to_delta.shape import pipeline_shape
from tests.support.started_pipeline import start_pipeline
from vocabulary.errors import ConfigError


def _pipeline(**extra: Any) -> PipelineSettings:
    pipeline = {"name": "people", "topics": ["people"], "table": "people", "primary_key": ["id"], **extra}
    return settings_from_mapping({"pipelines": [pipeline]}).pipelines[0]


def test_the_shorthand_names_the_table_and_debezium_orders_by_the_log_position():
    pipeline = _pipeline(history="scd2")
    assert pipeline.history is not None and pipeline.history.table_for(pipeline.table) == "people_history"
    assert pipeline.history_sequence_by == ("source.lsn",)
    assert pipeline.changelog_settings.sequence_by == ("source.lsn",)
    assert pipeline.history.tracked(["id", "a", "b"], ("id",)) == ["a", "b"]
    tracked = _pipeline(history={"track_history_except_column_list": ["b"]}).history
    assert tracked is not None and tracked.tracked(["id", "a", "b"], ("id",)) == ["a"]


@pytest.mark.parametrize(("extra", "reason"), [
    ({"history": {"track_history_column_list": ["a"], "track_history_except_column_list": ["b"]}}, "not both"),
    ({"history": {"sequence_by": ["a", "b"]}}, "names one value"),
    ({"history": "scd2", "from_changelog": {"preset": "flat"}}, "history.sequence_by"),
    ({"history": "scd2", "upsert_key": ["email"], "on_conflict": "error"}, "materializer"),
    ({"history": {"table": "people"}}, "must differ"),
    ({"history": "scd3"}, "scd2"),
])
def test_what_a_history_cannot_be_is_refused(extra, reason):
    with pytest.raises(ConfigError, match=reason):
        _pipeline(**extra)


def test_plan_shows_the_history_operator_and_the_shape_stays_the_plain_path():
    pipeline = _pipeline(history={"track_history_column_list": ["a"]})
    [operator] = pipeline_operators(pipeline)
    assert (operator.kind, operator.key) == (Kind.HISTORY, ("id",))
    assert operator.properties["history_table"] == "people_history"
    assert operator.properties["track_history_column_list"] == ["a"]
    shape = pipeline_shape(pipeline)
    # the ranges hand every row change over with their net changes (`history_rows`)
    assert shape.history and shape.reduces_where_read and not shape.reduces_per_batch and not shape.materializer
    settings = settings_from_mapping({"pipelines": [pipeline.model_dump()]})
    line = next(line for line in summary(settings) if "people/history" in line)
    assert "key (id)" in line and "people_history" in line


@pytest.mark.parametrize("changed", [
    {"track_history_column_list": ["a", "b"]},
    {"delete_markers": True},
    {"sequence_by": ["source.ts_ms"]},
])
def test_changing_the_history_of_a_started_pipeline_is_refused_naming_the_way_forward(tmp_path, changed):
    start_pipeline(tmp_path, _pipeline(history={"track_history_column_list": ["a"]}))
    with pytest.raises(ConfigError) as refused:
        check_and_store_pipeline(_pipeline(history={"track_history_column_list": ["a"], **changed}),
                                 str(tmp_path / "people"))
    message = str(refused.value)
    assert "people/history" in message and "new table (`history.table`)" in message


def test_the_same_history_restarts(tmp_path):
    start_pipeline(tmp_path, _pipeline(history="scd2"))
    check_and_store_pipeline(_pipeline(history="scd2"), str(tmp_path / "people"))
