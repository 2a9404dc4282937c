"""`columns:` in the configuration, the compiled plan, the pipeline's shape and the upgrade check."""

from __future__ import annotations

from typing import Any

import pytest

from service.config.columns import salt_fingerprint
from service.config.settings import PipelineSettings, settings_from_mapping
from service.kafka_to_delta.plan.compiled_plan import Kind, pipeline_operators, summary
from service.kafka_to_delta.plan.upgrades import check_and_store_pipeline
from service.kafka_to_delta.shape import pipeline_shape
from tests.support.started_pipeline import start_pipeline
from vocabulary.errors import ConfigError

SALT_ENV = "CDC_TEST_PLAN_SALT"
MASKED = {"mask": {"email": "sha256"}, "salt_env": SALT_ENV}


def _pipeline(**extra: Any) -> PipelineSettings:
    pipeline = {"name": "people", "topics": ["people"], "table": "people", "primary_key": ["id"], **extra}
    return settings_from_mapping({"pipelines": [pipeline]}).pipelines[0]


def test_include_keeps_the_key_and_exclude_drops_only_what_it_names():
    include = _pipeline(columns={"include": ["email"]}).columns
    assert include is not None and [c for c in ("id", "email", "name") if include.keeps(c, ("id",))] == ["id", "email"]
    exclude = _pipeline(columns={"exclude": "name"}).columns
    assert exclude is not None and [c for c in ("id", "email", "name") if exclude.keeps(c, ("id",))] == ["id", "email"]


@pytest.mark.parametrize(("columns", "reason"), [
    ({"exclude": ["id"]}, r"pipeline people: columns: exclude names primary key column\(s\) \['id'\]"),
    ({"include": ["a"], "exclude": ["b"]}, "include or exclude, not both"),
    ({"mask": {"email": "sha256"}}, "mask needs salt_env"),
    ({"mask": {"email": "md5"}, "salt_env": "S"}, "sha256"),
    ({"computed": {"a b": "1"}}, "computed"),
    ({"computed": {"id": "1"}}, r"pipeline people: columns: computed column\(s\) \['id'\] are primary key"),
    ({"computed": {"d": " "}}, "computed column 'd': empty expression"),
    ({"filter": ""}, "filter: empty expression"),
    ({"salt_env": "NOT-A-NAME", "mask": {"e": "sha256"}}, "salt_env"),
])
def test_what_columns_cannot_be_is_refused(columns, reason):
    with pytest.raises(ConfigError, match=reason):
        _pipeline(columns=columns)


def test_computed_columns_and_a_filter_cannot_be_combined_with_a_history_selection_and_masking_can():
    with pytest.raises(ConfigError, match="pipeline people: columns: computed cannot be combined with history"):
        _pipeline(columns={"computed": {"d": "upper(email)"}}, history="scd2")
    with pytest.raises(ConfigError, match="pipeline people: columns: computed and filter cannot be combined"):
        _pipeline(columns={"computed": {"d": "upper(email)"}, "filter": "id > 0"}, history="scd2")
    pipeline = _pipeline(columns={"exclude": ["name"], **MASKED}, history="scd2")
    assert pipeline.history is not None and pipeline.columns.mask


def test_plan_shows_the_columns_with_a_fingerprint_of_the_salt_never_the_salt(monkeypatch):
    monkeypatch.setenv(SALT_ENV, "pepper-1")
    pipeline = _pipeline(columns={"exclude": ["name"], "computed": {"d": "upper(email)"}, "filter": "x > 1",
                                  **MASKED})
    [operator] = pipeline_operators(pipeline)
    assert (operator.kind, operator.key, operator.state) == (Kind.COLUMNS, (), ())
    assert operator.properties == {"include": None, "exclude": ["name"], "computed.d": "upper(email)",
                                   "filter": "x > 1", "mask": {"email": "sha256"},
                                   "salt": salt_fingerprint("pepper-1")}
    assert pipeline_shape(pipeline).reduces_where_read
    line = next(line for line in summary(settings_from_mapping({"pipelines": [pipeline.model_dump()]}))
                if "people/columns" in line)
    assert "filter=x > 1" in line and "pepper-1" not in line


@pytest.mark.parametrize(("before", "after", "refused"), [
    (None, {"filter": "x > 1"}, "filter changed"),
    ({"filter": "x > 1"}, {"filter": "x > 2"}, "filter changed"),
    (None, MASKED, "mask changed"),
    ({"exclude": ["a"]}, {"exclude": ["a", "b"]}, "exclude changed"),
    ({"computed": {"d": "1"}}, {"computed": {"d": "2"}}, "computed.d changed"),
    ({"computed": {"d": "1"}}, None, "computed.d changed"),
    ({"include": ["a"]}, None, "include changed"),
])
def test_the_upgrade_check_refuses_what_the_stored_rows_would_contradict(tmp_path, monkeypatch, before, after,
                                                                         refused):
    monkeypatch.setenv(SALT_ENV, "pepper-1")
    start_pipeline(tmp_path, _pipeline(columns=before))
    with pytest.raises(ConfigError, match=refused) as error:
        check_and_store_pipeline(_pipeline(columns=after), str(tmp_path / "people"))
    assert "new table" in str(error.value)


def test_a_new_salt_is_refused_and_an_added_computed_column_is_allowed(tmp_path, monkeypatch):
    monkeypatch.setenv(SALT_ENV, "pepper-1")
    start_pipeline(tmp_path, _pipeline(columns=MASKED))
    monkeypatch.setenv(SALT_ENV, "pepper-2")
    with pytest.raises(ConfigError, match="salt changed"):
        check_and_store_pipeline(_pipeline(columns=MASKED), str(tmp_path / "people"))
    monkeypatch.setenv(SALT_ENV, "pepper-1")
    check_and_store_pipeline(_pipeline(columns={**MASKED, "computed": {"d": "upper(email)"}}),
                             str(tmp_path / "people"))
    start_pipeline(tmp_path / "plain", _pipeline())  # a started pipeline without columns may add computed ones
    check_and_store_pipeline(_pipeline(columns={"computed": {"d": "1"}}), str(tmp_path / "plain" / "people"))
