"""Stateful upgrade checks (`plan_upgrade`): one test per refused change and per allowed one.

A checkpoint is started under the base config (its plan stored, an offset-log entry written);
then every pipeline and join of the changed config is checked as the runner does before
anything runs. Refusals name the operator, the change and how to proceed (a new checkpoint; for
an ingest pipeline's materializer also `rebuild-state`). No Spark: the checks run before it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from service.config.settings import Settings, settings_from_mapping
from service.kafka_to_delta.materialize.bulk import DEFAULT_KEY_BUCKETS, LEGACY_KEY_BUCKETS
from service.kafka_to_delta.plan.compiled_plan import compile_plan, join_operators
from service.kafka_to_delta.plan.upgrades import (
    PLAN_FILE,
    check_and_store,
    check_and_store_pipeline,
    stored_bucket_layout,
)
from vocabulary.errors import ConfigError

BASE: dict[str, Any] = {
    "pipelines": [
        {"name": "people", "topics": ["people"], "table": "people", "primary_key": ["email"], "upsert_key": ["id"],
         "on_conflict": "error", "compaction": "batch", "state_ttl_seconds": 3600},
    ],
    "joins": [
        {"name": "orders_customers", "table": "orders_customers", "type": "inner", "primary_key": ["order_id"],
         "left": {"topics": ["orders"], "primary_key": ["order_id"], "join_key": ["customer_id"]},
         "right": {"topics": ["customers"], "primary_key": ["id"], "join_key": ["id"]},
         "left_state_ttl_seconds": 600, "right_state_ttl_seconds": 86400},
    ],
}
HOW_TO_PROCEED = "move the checkpoint directory away and start a new one"
REBUILD = "cdc-lakehouse rebuild-state CONFIG --pipeline people"


def _settings(config: dict[str, Any]) -> Settings:
    return settings_from_mapping(copy.deepcopy(config))


def _check(root: Path, config: dict[str, Any]) -> None:
    """What the runner does before it starts anything."""
    settings = _settings(config)
    for pipeline in settings.pipelines:
        check_and_store_pipeline(pipeline, str(root / pipeline.name))
    for join in settings.joins:
        check_and_store(join.name, str(root / join.name), join_operators(join))


def _started(root: Path) -> Path:
    _check(root, BASE)
    for name in ("people", "orders_customers"):
        (root / name / "offsets").mkdir()
        (root / name / "offsets" / "0").write_text("v1")
    return root


def _changed(pipeline: dict[str, Any] | None = None, join: dict[str, Any] | None = None) -> dict[str, Any]:
    config = copy.deepcopy(BASE)
    config["pipelines"][0].update(pipeline or {})
    config["joins"][0].update(join or {})
    return config


REFUSED = {
    "changed key": (_changed({"upsert_key": ["account"]}),
                    "operator 'people/materializer': key changed from ['id'] to ['account']"),
    "operator added": (_changed({"from_changelog": {"preset": "debezium", "order_by": "ts"}}),
                       "operator 'people/order_by' was added"),
    "operator removed": (_changed({"upsert_materialize": "none", "upsert_key": None, "primary_key": ["id"],
                                   "on_conflict": None}),
                         "operator 'people/materializer' was removed"),
    "on_conflict": (_changed({"on_conflict": "nothing"}),
                    "operator 'people/materializer': on_conflict changed from 'error' to 'nothing'"),
    "compaction": (_changed({"compaction": "watermark"}),
                   "operator 'people/materializer': compaction changed from 'batch' to 'watermark'"),
    "primary_key": (_changed({"primary_key": ["phone"]}),
                    "operator 'people/materializer': primary_key changed from ['email'] to ['phone']"),
    "sequence_by": (_changed({"sequence_by": ["source.lsn"]}),
                    "operator 'people/materializer': sequence_by changed from [] to ['source.lsn']"),
    "join type": (_changed(join={"type": "left"}),
                  "operator 'orders_customers/join': type changed from 'inner' to 'left'"),
}

REBUILDABLE = {"changed key", "on_conflict", "compaction", "primary_key", "sequence_by"}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_an_incompatible_change_is_refused_naming_the_operator_the_change_and_how_to_proceed(tmp_path, case):
    root = _started(tmp_path)
    config, change = REFUSED[case]
    plans = [root / "people" / PLAN_FILE, root / "orders_customers" / PLAN_FILE]
    stored = [plan.read_text() for plan in plans]
    with pytest.raises(ConfigError) as refused:
        _check(root, config)
    message = str(refused.value)
    assert change in message
    assert HOW_TO_PROCEED in message
    # rebuild-state is offered where it applies: a changed materializer that an ingest pipeline keeps
    assert (REBUILD in message) == (case in REBUILDABLE)
    assert [plan.read_text() for plan in plans] == stored  # the checkpoint keeps the plan it was started with


def test_a_ttl_change_goes_ahead_and_is_stored(tmp_path, caplog):
    root = _started(tmp_path)
    caplog.set_level("INFO")
    _check(root, _changed({"state_ttl_seconds": 60}, {"right_state_ttl_seconds": 120}))
    assert "people/materializer': rows TTL changed from 3600000 ms to 60000 ms" in caplog.text
    assert "orders_customers/join': right TTL changed from 86400000 ms to 120000 ms" in caplog.text
    stored = json.loads((root / "people" / PLAN_FILE).read_text())["nodes"][0]
    assert stored["state"][0]["ttl"] == "60000 ms"


def test_a_new_nullable_column_is_not_an_operator_change(tmp_path, caplog):
    """A column the source adds (or a passthrough column the config adds) changes the rows, which the
    state holds as opaque text, never an operator's key or properties: the plan is the same."""
    widened = _changed({"from_changelog": {"preset": "debezium", "passthrough": ["source.lsn"]}})
    assert compile_plan(_settings(widened)) == compile_plan(_settings(BASE))
    root = _started(tmp_path)
    caplog.set_level("INFO")
    _check(root, widened)
    assert "compatible plan change" not in caplog.text


def test_a_new_pipeline_goes_ahead_with_a_checkpoint_of_its_own(tmp_path):
    root = _started(tmp_path)
    grown = copy.deepcopy(BASE)
    grown["pipelines"].append({"name": "accounts", "topics": ["a", "b"], "table": "accounts", "primary_key": ["id"],
                               "on_conflict": "deduplicate"})
    _check(root, grown)
    assert json.loads((root / "accounts" / PLAN_FILE).read_text())["nodes"][0]["id"] == "accounts/materializer"


def _layout(root: Path) -> str:
    nodes = json.loads((root / "people" / PLAN_FILE).read_text())["nodes"]
    return next(n for n in nodes if n["id"] == "people/materializer")["properties"]["state_layout"]


def test_a_checkpoint_keeps_the_key_buckets_it_began_with(tmp_path: Path) -> None:
    checkpoint = str(tmp_path / "people")
    assert stored_bucket_layout("people", checkpoint) == (DEFAULT_KEY_BUCKETS, True), "a new checkpoint"
    _started(tmp_path)
    assert _layout(tmp_path) == f"spread key buckets: {DEFAULT_KEY_BUCKETS}"
    # Written by earlier versions: the bucket numbers as labels, 16 or 64 of them, or state per key.
    for layout, buckets in (("key buckets: 16", (16, False)), ("key buckets: 64", (64, False)), ("per key", (0, False)),
                            ("spread key buckets: 16", (16, True))):
        stored = json.loads((tmp_path / "people" / PLAN_FILE).read_text())
        next(n for n in stored["nodes"] if n["id"] == "people/materializer")["properties"]["state_layout"] = layout
        (tmp_path / "people" / PLAN_FILE).write_text(json.dumps(stored))
        assert stored_bucket_layout("people", checkpoint) == buckets
        _check(tmp_path, BASE)  # not refused: the start keeps the checkpoint's layout
        assert _layout(tmp_path) == layout
    (tmp_path / "people" / PLAN_FILE).unlink()  # begun before plans were stored
    assert stored_bucket_layout("people", checkpoint) == (LEGACY_KEY_BUCKETS, False)
    assert stored_bucket_layout("people", "s3a://bucket/checkpoints/people") == (LEGACY_KEY_BUCKETS, False), \
        "no plan there"
