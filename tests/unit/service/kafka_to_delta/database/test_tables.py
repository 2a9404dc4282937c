"""A database table whose override needs state becomes a pipeline of its own; the others stay in the
database's query, with the table's own stateless decoding where it has one."""

from __future__ import annotations

import pytest

from service.config.settings import settings_from_mapping
from service.kafka_to_delta.database.tables import own_query_pipelines, with_table_pipelines
from service.kafka_to_delta.plan.compiled_plan import compile_plan
from vocabulary.errors import ConfigError

TOPICS = ["db1.public.orders", "db1.public.customers", "db1.public.audit", "other.x"]


def _settings(tables: dict) -> object:
    return settings_from_mapping({"databases": [{
        "name": "inv", "topic_pattern": r"db1\.(?P<schema>[^.]+)\.(?P<table>[^.]+)", "table_name": "{table}",
        "tables": tables}]})


def test_a_table_with_state_runs_as_its_own_pipeline_with_its_operator_in_the_plan():
    settings = _settings({
        "orders": {"primary_key": "id", "sequence_by": ["updated_at"], "upsert_materialize": "force",
                   "on_conflict": "deduplicate"},
        "audit": {"from_changelog": {"preset": "debezium", "decode_error_handling": "SKIP"}},
    })
    database = settings.databases[0]
    assert database.shared_routes(TOPICS) == {"db1.public.audit": "audit", "db1.public.customers": "customers"}
    expanded = with_table_pipelines(settings, TOPICS)
    (orders,) = expanded.pipelines
    assert (orders.name, orders.topics, orders.table, orders.primary_key) == (
        "inv.orders", ("db1.public.orders",), "orders", ("id",))
    assert orders.materialized and orders.sequence_by == ("updated_at",)
    plan = compile_plan(expanded)
    assert [(node["id"], node["key"]) for node in plan["nodes"]] == [("inv.orders/materializer", ["id"])]
    assert with_table_pipelines(expanded, TOPICS).pipelines == expanded.pipelines  # expanding twice adds nothing
    assert own_query_pipelines(database, ["db1.public.customers"]) == []  # its topic not there yet: none


def test_a_table_with_state_needs_its_primary_key():
    with pytest.raises(ConfigError, match="needs its `primary_key`"):
        _settings({"orders": {"sequence_by": ["updated_at"]}})


def test_a_table_pipeline_that_cannot_be_valid_names_database_and_table_when_the_config_is_read():
    with pytest.raises(ConfigError, match="database inv, table orders: .*on_conflict"):  # keys differ, no on_conflict
        _settings({"orders": {"primary_key": "id", "upsert_key": ["other"]}})
