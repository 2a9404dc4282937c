"""What a checkpoint or a Delta table remembers by name does not depend on where the code lives.

Spark's checkpoint names each query's source by its data source name, the stored `plan.json` names
each operator by `<pipeline>/<kind>`, and Delta commits carry an application id: none of them may
contain a module path, or moving a module would orphan every checkpoint written before.

The expected values are what commit 41c9bfd (the tree before the regrouping) produced for the same
inputs, observed by running this probe with the old tree first on sys.path:

    git worktree add /tmp/old41 41c9bfd && cd /tmp/old41
    PYTHONPATH=/tmp/old41 /work/main/.venv/bin/python -c '
    import hashlib, json
    from service.kafka_to_delta.changes_source import changes_source_name
    from service.compiled_plan import compile_plan
    from service.settings import settings_from_mapping
    from service.batch_pipeline import commit_app_id
    from service.joins import join_source
    from connectors.kafka.source import FORMAT_NAME, KafkaSource
    from connectors.delta.change_feed import FORMAT_NAME as CDF, DeltaChangeFeedSource
    plan = compile_plan(settings_from_mapping(CONFIG))   # CONFIG below
    print(changes_source_name("orders-eu.v2"), KafkaSource.name(), join_source.FORMAT_NAME,
          DeltaChangeFeedSource.name(), commit_app_id("people", "people", "q-1"),
          [n["id"] for n in plan["nodes"]],
          hashlib.sha256(json.dumps(plan, sort_keys=True, separators=(",", ":")).encode()).hexdigest())'
"""

from __future__ import annotations

import hashlib
import json

import pytest

from connectors.delta.change_feed import FORMAT_NAME as CHANGE_FEED_FORMAT
from connectors.delta.change_feed import DeltaChangeFeedSource
from connectors.kafka.source import FORMAT_NAME as KAFKA_FORMAT
from connectors.kafka.source import KafkaSource
from service.config.settings import settings_from_mapping
from service.kafka_to_delta.joins import join_source
from service.kafka_to_delta.plan.compiled_plan import compile_plan
from service.kafka_to_delta.source.changes_source import changes_source, changes_source_name
from service.supervisor.batch_pipeline import commit_app_id

# Every operator kind: a materializer over two topics, ORDER BY and a stateful FROM_CHANGELOG, a
# materializer with sequence_by, one keyed apart from its topic's upsert key, the plain path, a
# regular join and a gated enrichment join.
CONFIG = {
    "pipelines": [
        {"name": "orders", "topics": ["a", "b"], "table": "orders", "primary_key": ["id"],
         "on_conflict": "deduplicate", "state_ttl_seconds": 3600},
        {"name": "flat", "topics": ["f"], "table": "flat", "primary_key": ["id"],
         "from_changelog": {"preset": "debezium", "state_ttl_seconds": 86400, "order_by": "ts"}},
        {"name": "people", "topics": ["p"], "table": "people", "primary_key": ["id"], "sequence_by": ["ts_ms"],
         "on_conflict": "deduplicate", "tombstone_retention_seconds": 86400, "state_ttl_seconds": 86400},
        {"name": "by_email", "topics": ["p"], "table": "by_email", "primary_key": ["email"], "upsert_key": ["id"],
         "on_conflict": "error", "state_ttl_seconds": 86400},
        {"name": "plain", "topics": ["p"], "table": "plain", "primary_key": ["id"]},
    ],
    "joins": [
        {"name": "enriched", "type": "left", "table": "enriched", "primary_key": ["order_id"],
         "left": {"topics": ["orders"], "primary_key": ["order_id"], "join_key": ["customer_id"]},
         "right": {"topics": ["customers"], "primary_key": ["customer_id"], "join_key": ["customer_id"]},
         "left_state_ttl_seconds": 3600, "right_state_ttl_seconds": 600, "on_conflict": "deduplicate"},
        {"name": "gated", "type": "enrichment", "table": "gated", "primary_key": ["order_id"],
         "left": {"topics": ["probe"], "primary_key": ["order_id"], "join_key": ["customer_id"]},
         "right": {"topics": ["build"], "primary_key": ["customer_id"], "join_key": ["customer_id"]},
         "state_ttl_seconds": 86400},
    ],
}
# Observed at 41c9bfd (module docstring).
OPERATOR_IDS_41C9BFD = [
    "orders/materializer", "flat/order_by", "flat/from_changelog", "people/materializer", "by_email/materializer",
    "enriched/join", "enriched/materializer", "gated/snapshot_gate", "gated/enrichment",
]
PLAN_SHA256_41C9BFD = "101c3143d626ab992f3299a2f44011efbfb10dba14e3e39516c826f3afad98c1"
MODULE_WORDS = ("service", "connectors", "vocabulary", "kafka_to_delta", "delta_to_kafka", "joins", "plan.")


def _plan() -> dict:
    return compile_plan(settings_from_mapping(json.loads(json.dumps(CONFIG))))


def _names_no_module(*names: str) -> None:
    for name in names:
        assert not any(word in name for word in MODULE_WORDS), f"{name!r} names a module"


@pytest.mark.parametrize("pipeline, name", [
    ("people", "cdc_changes_people"), ("by_email", "cdc_changes_by_email"), ("orders-eu.v2", "cdc_changes_orders_eu_v2"),
])
def test_a_pipelines_source_name_is_the_one_41c9bfd_gave_it(pipeline, name):
    assert changes_source_name(pipeline) == name
    assert changes_source(pipeline, reducer=None).name() == name  # the class Spark registers
    _names_no_module(name)


def test_the_kafka_source_of_joins_and_the_change_feed_keep_their_names():
    assert KAFKA_FORMAT == KafkaSource.name() == join_source.FORMAT_NAME == "cdc_kafka"
    assert CHANGE_FEED_FORMAT == DeltaChangeFeedSource.name() == "delta_cdf"


def test_delta_commits_keep_their_application_id():
    assert commit_app_id("people", "people", "q-1") == "cdc-lakehouse/people/people/q-1"


def test_the_compiled_plan_has_the_operator_ids_and_the_bytes_of_41c9bfd():
    plan = _plan()
    ids = [node["id"] for node in plan["nodes"]]
    assert ids == OPERATOR_IDS_41C9BFD
    _names_no_module(*ids)
    text = json.dumps(plan, sort_keys=True, separators=(",", ":"))
    _names_no_module(text)
    # A new checkpoint's materializer spreads its key buckets since (`bucket_labels`): that layout's name is
    # the one change; every other byte is 41c9bfd's.
    layouts = [node["properties"]["state_layout"] for node in plan["nodes"] if "state_layout" in node["properties"]]
    assert layouts and set(layouts) == {"spread key buckets: 16"}
    text = text.replace('"state_layout":"spread key buckets: 16"', '"state_layout":"key buckets: 16"')
    assert hashlib.sha256(text.encode()).hexdigest() == PLAN_SHA256_41C9BFD
