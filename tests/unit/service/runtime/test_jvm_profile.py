"""Which JVM profile the compiled plan chooses (no Spark: the choice is made before the session starts)."""

from __future__ import annotations

from service.config.settings import SparkSettings, settings_from_mapping
from service.kafka_to_delta.plan.compiled_plan import Kind, compile_plan
from service.runtime import jvm_profiles
from service.runtime.jvm_profiles import LIGHT, PACKED_STATE, STATEFUL, JvmProfile, jvm_profile
from service.runtime.spark_session import spark_conf
from service.supervisor.runner import Runner

PLAIN = {"name": "plain", "topics": ["p"], "table": "plain", "primary_key": ["id"]}
MATERIALIZED = {"name": "orders", "topics": ["a", "b"], "table": "orders", "primary_key": ["id"], "on_conflict": "nothing"}
ORDERED = {"name": "flat", "topics": ["f"], "table": "flat", "primary_key": ["id"],
           "from_changelog": {"preset": "debezium", "order_by": "ts"}}
JOIN = {"name": "enriched", "type": "left", "table": "enriched", "primary_key": ["order_id"],
        "left": {"topics": ["orders"], "primary_key": ["order_id"], "join_key": ["customer_id"]},
        "right": {"topics": ["customers"], "primary_key": ["customer_id"], "join_key": ["customer_id"]}}


def _profile(pipelines: list[dict], joins: list[dict] | None = None) -> JvmProfile:
    runner = Runner(settings_from_mapping({"pipelines": pipelines, "joins": joins or []}))
    return runner._jvm()


def test_plain_pipelines_get_the_light_jvm():
    assert _profile([PLAIN]) == LIGHT


def test_the_bucket_materializer_alone_gets_c1_with_the_stateful_heap():
    assert _profile([PLAIN, MATERIALIZED]) == PACKED_STATE


def test_stateful_from_changelog_or_a_join_keeps_c2():
    assert _profile([MATERIALIZED, ORDERED]) == STATEFUL
    assert _profile([MATERIALIZED], [JOIN]) == STATEFUL


def test_a_new_stateful_operator_gets_the_stateful_profile():
    settings = settings_from_mapping({"pipelines": [PLAIN, MATERIALIZED]})
    plan = compile_plan(settings)
    plan["nodes"].append({"id": "plain/window_aggregate", "kind": "window_aggregate", "key": ["id"], "state": []})
    assert jvm_profile(plan) == STATEFUL
    assert jvm_profile({"pipelines": ["x"], "nodes": [{"kind": "window_aggregate"}]}) == STATEFUL


def test_a_pipelines_settings_in_the_plan_are_not_state():
    # A table shape (deletion vectors here) or a `columns:` block is a node of the plan, not a stateful operator.
    shaped = {**MATERIALIZED, "table_shape": {"deletion_vectors": True},
              "columns": {"exclude": ["note"]}}
    assert {node["kind"] for node in compile_plan(settings_from_mapping({"pipelines": [shaped]}))["nodes"]} == {
        Kind.MATERIALIZER, Kind.TABLE_SHAPE, Kind.COLUMNS}
    assert _profile([shaped]) == PACKED_STATE
    assert _profile([{**PLAIN, "table_shape": {"deletes": "soft"}}]) == LIGHT


def test_every_known_kind_but_the_packed_and_setting_ones_gets_the_stateful_profile():
    kinds = {value for name, value in vars(Kind).items() if name.isupper()}
    assert jvm_profiles.PACKED_KINDS <= kinds, "a packed kind the plan no longer has"
    assert jvm_profiles.SETTING_KINDS <= kinds, "a setting kind the plan no longer has"
    for kind in kinds - jvm_profiles.PACKED_KINDS - jvm_profiles.SETTING_KINDS:
        assert jvm_profile({"nodes": [{"kind": kind}, {"kind": Kind.MATERIALIZER}]}) == STATEFUL, kind


def test_the_profiles_flags():
    c1 = jvm_profiles.C1_ONLY
    assert c1 in LIGHT.options and "-Xms64m" in LIGHT.options
    assert c1 in PACKED_STATE.options and "-Xmn64m" in PACKED_STATE.options
    assert c1 not in STATEFUL.options and "-Xmn64m" in STATEFUL.options
    assert all("-XX:+UseSerialGC" in p.options for p in (LIGHT, PACKED_STATE, STATEFUL))


def test_a_local_session_gets_the_profile_and_a_cluster_does_not():
    local = spark_conf(SparkSettings(master="local[2]"), jvm=PACKED_STATE)["spark.driver.extraJavaOptions"]
    assert PACKED_STATE.options in local
    cluster = spark_conf(SparkSettings(master="spark://host:7077"), jvm=LIGHT)["spark.driver.extraJavaOptions"]
    assert "-XX:+UseSerialGC" not in cluster and jvm_profiles.C1_ONLY not in cluster
