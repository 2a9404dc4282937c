"""The compiled plan (`cdc-lakehouse plan`), running with a plan (`run --plan`) and stateful
upgrade checks against the plan stored with a checkpoint (no Spark: the checks run before it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from service.__main__ import app
from service.config.settings import settings_from_mapping
from service.kafka_to_delta.plan.compiled_plan import (
    apply_plan,
    compile_plan,
    pipeline_operators,
    read_plan,
)
from service.kafka_to_delta.plan.upgrades import check_and_store
from vocabulary.errors import ConfigError

CONFIG = {
    "pipelines": [
        {"name": "orders", "topics": ["a", "b"], "table": "orders", "primary_key": ["id"],
         "on_conflict": "deduplicate", "state_ttl_seconds": 3600},
        {"name": "flat", "topics": ["f"], "table": "flat", "primary_key": ["id"],
         "from_changelog": {"preset": "debezium", "state_ttl_seconds": 86400, "order_by": "ts"}},
        {"name": "plain", "topics": ["p"], "table": "plain", "primary_key": ["id"]},
    ]
}


def _settings(config: dict = CONFIG):
    return settings_from_mapping(json.loads(json.dumps(config)))


def _changed(**pipeline_update) -> dict:
    config = json.loads(json.dumps(CONFIG))
    config["pipelines"][0].update(pipeline_update)
    return config


def test_the_plan_lists_every_stateful_operator_in_the_spec_shape():
    plan = compile_plan(_settings())
    nodes = {node["id"]: node for node in plan["nodes"]}
    assert sorted(nodes) == ["flat/from_changelog", "flat/order_by", "orders/materializer"]
    assert nodes["orders/materializer"]["state"] == [{"index": 0, "ttl": "3600000 ms", "name": "rows"}]
    assert nodes["orders/materializer"]["key"] == ["topic", "id"]
    assert nodes["flat/from_changelog"]["state"] == [{"index": 0, "ttl": "86400000 ms", "name": "image"}]
    assert nodes["orders/materializer"]["properties"]["on_conflict"] == "deduplicate"


def test_run_with_a_plan_takes_its_ttls_over_the_config(tmp_path):
    plan = compile_plan(_settings())
    for node in plan["nodes"]:
        for entry in node["state"]:
            entry["ttl"] = "60000 ms"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    settings = apply_plan(_settings(), read_plan(path))
    orders, flat, _ = settings.pipelines
    assert orders.materializer_ttl_seconds == 60
    assert flat.from_changelog.state_ttl_seconds == 60


def test_a_plan_that_does_not_match_the_config_is_refused_naming_the_operator(tmp_path):
    plan = compile_plan(_settings())
    plan["nodes"] = [n for n in plan["nodes"] if n["id"] != "flat/order_by"]
    with pytest.raises(ConfigError, match="'flat/order_by' of the config is not in the plan"):
        apply_plan(_settings(), plan)
    plan = compile_plan(_settings())
    plan["nodes"][0]["key"] = ["email"]
    with pytest.raises(ConfigError, match="'orders/materializer'"):
        apply_plan(_settings(), plan)
    path = tmp_path / "bad.json"
    plan = compile_plan(_settings())
    plan["nodes"][0]["state"][0]["ttl"] = "1 hour"
    path.write_text(json.dumps(plan))
    with pytest.raises(ConfigError, match="ttl must look like '3600000 ms'"):
        read_plan(path)


def _started_checkpoint(root: Path, config: dict) -> Path:
    checkpoint = root / "orders"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / "0").write_text("v1")
    check_and_store("orders", str(checkpoint), pipeline_operators(_settings(config).pipelines[0]))
    return checkpoint


@pytest.mark.parametrize("update, change", [
    ({"on_conflict": "nothing"}, "on_conflict changed from 'deduplicate' to 'nothing'"),
    ({"upsert_key": ["email"]}, "key changed from ['topic', 'id'] to ['topic', 'email']"),
    ({"upsert_materialize": "none", "topics": ["a"]}, "operator 'orders/materializer' was removed"),
])
def test_an_incompatible_upgrade_is_refused_naming_the_operator_and_the_change(tmp_path, update, change):
    checkpoint = _started_checkpoint(tmp_path, CONFIG)
    with pytest.raises(ConfigError) as refused:
        check_and_store("orders", str(checkpoint), pipeline_operators(_settings(_changed(**update)).pipelines[0]))
    assert change in str(refused.value)
    assert "start a new one" in str(refused.value)
    assert json.loads((checkpoint / "plan.json").read_text())["nodes"][0]["properties"]["on_conflict"] == "deduplicate"


def test_adding_state_to_a_started_stateless_pipeline_is_refused(tmp_path):
    plain = {"pipelines": [{"name": "orders", "topics": ["a"], "table": "t", "primary_key": ["id"]}]}
    checkpoint = _started_checkpoint(tmp_path, plain)
    stateful = {"pipelines": [{**plain["pipelines"][0], "upsert_materialize": "force"}]}
    with pytest.raises(ConfigError, match="operator 'orders/materializer' was added"):
        check_and_store("orders", str(checkpoint), pipeline_operators(_settings(stateful).pipelines[0]))


def test_a_ttl_change_and_a_new_checkpoint_go_ahead(tmp_path, caplog):
    checkpoint = _started_checkpoint(tmp_path, CONFIG)
    caplog.set_level("INFO")
    check_and_store("orders", str(checkpoint), pipeline_operators(_settings(_changed(state_ttl_seconds=60)).pipelines[0]))
    assert "rows TTL changed from 3600000 ms to 60000 ms" in caplog.text
    stored = json.loads((checkpoint / "plan.json").read_text())
    assert stored["nodes"][0]["state"][0]["ttl"] == "60000 ms"
    fresh = tmp_path / "new"
    check_and_store("orders", str(fresh), pipeline_operators(_settings(_changed(on_conflict="nothing")).pipelines[0]))
    assert (fresh / "plan.json").exists()


def test_the_plan_command_writes_the_json_and_prints_a_summary(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    result = CliRunner().invoke(app, ["plan", str(config), "-o", str(tmp_path / "plan.json")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "plan.json").read_text())["nodes"]
    assert "orders/materializer" in result.output and "TTL rows 1 h" in result.output
    assert "pipeline plain: no state" in result.output


def test_run_with_a_mismatched_plan_exits_1_before_anything_starts(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    plan = compile_plan(_settings())
    plan["nodes"].append({"id": "gone/materializer", "kind": "materializer", "key": ["id"], "state": []})
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    result = CliRunner().invoke(app, ["run", str(config), "--plan", str(tmp_path / "plan.json")])
    assert result.exit_code == 1
    assert "gone/materializer" in result.output


def test_a_checkpoint_of_another_materializer_state_layout_is_refused(tmp_path):
    checkpoint = _started_checkpoint(tmp_path, CONFIG)
    stored = json.loads((checkpoint / "plan.json").read_text())
    stored["nodes"][0]["properties"]["state_layout"] = "per key"  # written by the per-key stage
    (checkpoint / "plan.json").write_text(json.dumps(stored))
    with pytest.raises(ConfigError, match="state_layout changed from 'per key'"):
        check_and_store("orders", str(checkpoint), pipeline_operators(_settings().pipelines[0]))


JOINS = [
    {"name": "enriched", "type": "left", "table": "enriched", "primary_key": ["order_id"],
     "left": {"topics": ["orders"], "primary_key": ["order_id"], "join_key": ["customer_id"]},
     "right": {"topics": ["customers"], "primary_key": ["customer_id"], "join_key": ["customer_id"]},
     "left_state_ttl_seconds": 3600, "right_state_ttl_seconds": 600, "on_conflict": "deduplicate"},
    {"name": "gated", "type": "enrichment", "table": "gated", "primary_key": ["order_id"],
     "left": {"topics": ["probe"], "primary_key": ["order_id"], "join_key": ["customer_id"]},
     "right": {"topics": ["build"], "primary_key": ["customer_id"], "join_key": ["customer_id"]},
     "state_ttl_seconds": 86400},
]


def test_the_plan_of_ingest_materializer_order_by_and_both_joins_has_the_spec_shape():
    plan = compile_plan(_settings({**CONFIG, "joins": JOINS}))
    nodes = {node["id"]: node for node in plan["nodes"]}
    assert sorted(nodes) == ["enriched/join", "enriched/materializer", "flat/from_changelog", "flat/order_by",
                             "gated/enrichment", "gated/snapshot_gate", "orders/materializer"]
    for node in plan["nodes"]:
        assert set(node) >= {"id", "kind", "key", "state"}
        assert [entry["index"] for entry in node["state"]] == list(range(len(node["state"])))
        assert all(entry["ttl"].endswith(" ms") and entry["ttl"][:-3].isdigit() for entry in node["state"])
    assert nodes["enriched/join"]["state"] == [{"index": 0, "ttl": "3600000 ms", "name": "left"},
                                               {"index": 1, "ttl": "600000 ms", "name": "right"}]
    assert nodes["enriched/join"]["key"] == ["customer_id"]
    assert nodes["enriched/materializer"]["key"] == ["order_id", "customer_id"]
    assert nodes["gated/enrichment"]["state"] == [{"index": 0, "ttl": "86400000 ms", "name": "build"}]
    assert [e["name"] for e in nodes["gated/snapshot_gate"]["state"]] == ["snapshot_progress", "held_probes"]


def test_editing_one_join_ttl_in_the_plan_changes_that_ttl_and_nothing_else(tmp_path):
    settings = _settings({**CONFIG, "joins": JOINS})
    plan = compile_plan(settings)
    next(e for n in plan["nodes"] if n["id"] == "enriched/join" for e in n["state"] if e["name"] == "left")["ttl"] = \
        "60000 ms"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    planned = apply_plan(settings, read_plan(path))
    assert planned.joins[0].left_ttl_seconds == 60
    assert {**planned.joins[0].model_dump(), "left_state_ttl_seconds": 3600} == settings.joins[0].model_dump()
    assert planned.joins[1].model_dump() == settings.joins[1].model_dump()
    assert compile_plan(planned)["nodes"] == [
        node if node["id"] != "enriched/join" else {**node, "state": [{**node["state"][0], "ttl": "60000 ms"},
                                                                       node["state"][1]]}
        for node in compile_plan(settings)["nodes"]
    ]
