"""Which JVM profile the runner asks for (no Spark: the choice is made before the session starts)."""

from __future__ import annotations

from service.config.settings import settings_from_mapping
from service.supervisor.runner import Runner

PLAIN = {"name": "plain", "topics": ["p"], "table": "plain", "primary_key": ["id"]}
MATERIALIZED = {"name": "orders", "topics": ["a", "b"], "table": "orders", "primary_key": ["id"], "on_conflict": "nothing"}
ORDERED = {"name": "flat", "topics": ["f"], "table": "flat", "primary_key": ["id"],
           "from_changelog": {"preset": "debezium", "order_by": "ts"}}
JOIN = {"name": "enriched", "type": "left", "table": "enriched", "primary_key": ["order_id"],
        "left": {"topics": ["orders"], "primary_key": ["order_id"], "join_key": ["customer_id"]},
        "right": {"topics": ["customers"], "primary_key": ["customer_id"], "join_key": ["customer_id"]}}


def _profile(pipelines: list[dict], joins: list[dict] | None = None) -> tuple[bool, bool]:
    runner = Runner(settings_from_mapping({"pipelines": pipelines, "joins": joins or []}))
    return runner._jvm_light(), runner._jvm_packed()


def test_plain_pipelines_get_the_light_jvm():
    assert _profile([PLAIN]) == (True, True)


def test_the_bucket_materializer_alone_gets_c1_with_the_stateful_heap():
    assert _profile([PLAIN, MATERIALIZED]) == (False, True)


def test_stateful_from_changelog_or_a_join_keeps_c2():
    assert _profile([MATERIALIZED, ORDERED]) == (False, False)
    assert _profile([MATERIALIZED], [JOIN]) == (False, False)
