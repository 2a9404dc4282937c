"""A database table's history, columns and table_shape: checked when the config is read (naming the
database, the table and the option), run as the table's own pipeline with its nodes in the plan, and
held by the upgrade check as a pipeline's are, including a started table moved into or out of its own
query."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.__main__ import _table_pipelines
from service.config.settings import Settings, settings_from_mapping
from service.kafka_to_delta.database.tables import naming_tables, with_table_pipelines
from service.kafka_to_delta.plan.compiled_plan import compile_plan
from service.kafka_to_delta.plan.table_queries import check_table_queries
from service.kafka_to_delta.plan.table_routes import store_routes
from service.kafka_to_delta.plan.upgrades import check_and_store_pipeline
from tests.support.started_pipeline import start_pipeline
from vocabulary.errors import ConfigError

TOPICS = ["db1.public.orders", "db1.public.customers"]
SHAPED = {"primary_key": ["id"], "history": "scd2", "table_shape": {"deletes": "soft", "partition_by": ["region"]},
          "columns": {"mask": {"email": "sha256"}, "salt_env": "PII_SALT"}}


def _settings(tables: dict, engine: str = "delta-rs", root: Any = "/tmp/unused", **database: Any) -> Settings:
    return settings_from_mapping({
        "lakehouse": {"engine": engine}, "checkpoint_root": str(root),
        "databases": [{"name": "inv", "topic_pattern": r"db1\.(?P<schema>[^.]+)\.(?P<table>[^.]+)",
                       "tables": tables, **database}]})


@pytest.mark.parametrize(("override", "engine", "reason"), [
    ({"history": "scd2", "upsert_key": ["other"], "on_conflict": "error"}, "delta-rs",
     r"database inv, table orders: history is built from every change of a micro-batch, which the keyed-state "
     "materializer does not hand on"),
    ({"history": {"table": "orders"}}, "delta-rs",
     "database inv, table orders: history: the history table must differ from the pipeline's table"),
    ({"history": "scd2", "from_changelog": {"preset": "flat"}}, "delta-rs",
     r"database inv, table orders: history needs `history.sequence_by`"),
    ({"columns": {"exclude": ["id"]}}, "delta-rs",
     r"database inv, table orders: columns: exclude names primary key column\(s\) \['id'\]"),
    ({"columns": {"computed": {"id": "1"}}}, "delta-rs",
     r"database inv, table orders: columns: computed column\(s\) \['id'\] are primary key columns"),
    ({"columns": {"history": "scd2"}}, "delta-rs", r"tables\.orders\.columns\.history: unknown key"),
    ({"table_shape": {"cluster_by": ["region"]}}, "delta-rs",
     "database inv, table orders: table_shape: cluster_by .* delta-rs engine cannot create a table with liquid "
     "clustering"),
    ({"table_shape": {"deletes": "soft"}, "from_changelog": {"preset": "debezium", "truncate_handling": "truncate"}},
     "delta-rs", "database inv, table orders: table_shape: deletes: soft cannot be combined with truncate_handling"),
    ({"table_shape": {"partition_by": ["__DELETED"]}}, "delta-spark",
     r"tables\.orders\.table_shape: .*soft deletes' own columns"),
    ({"history": "scd2", "columns": {"filter": "id > 0"}}, "delta-rs",
     "database inv, table orders: columns: filter cannot be combined with history"),
])
def test_a_bad_table_setting_is_refused_when_the_config_is_read_naming_database_table_and_option(
        override, engine, reason):
    with pytest.raises(ConfigError, match=reason):
        _settings({"orders": {"primary_key": ["id"], **override}}, engine)


@pytest.mark.parametrize("shape", [{"history": "scd2"}, {"columns": {"include": ["name"]}},
                                   {"table_shape": {"ignore_null_updates": True}}])
def test_a_table_with_a_shape_needs_its_primary_key(shape):
    with pytest.raises(ConfigError, match=r"tables\.orders: .*or a shape .*needs its `primary_key`"):
        _settings({"orders": shape})


def test_the_default_shape_keeps_a_table_in_the_shared_query():
    database = _settings({"orders": {"table_shape": {"deletes": "hard"}, "primary_key": ["id"]}}).databases[0]
    assert not database.override("orders").own_query
    assert database.shared_routes(TOPICS) == {"db1.public.customers": "customers", "db1.public.orders": "orders"}


def test_a_shaped_table_runs_as_its_own_pipeline_with_its_nodes_in_the_plan_and_validate():
    settings = _settings({"customers": SHAPED}, "delta-spark")
    database = settings.databases[0]
    assert database.shared_routes(TOPICS) == {"db1.public.orders": "orders"}
    (customers,) = with_table_pipelines(settings, TOPICS).pipelines
    assert (customers.name, customers.topics, customers.primary_key) == ("inv.customers", ("db1.public.customers",),
                                                                         ("id",))
    assert customers.history is not None and customers.history_sequence_by == ("source.lsn",)
    assert customers.table_shape.soft_deletes and customers.columns.mask == {"email": "sha256"}
    nodes = {node["id"]: node for node in compile_plan(with_table_pipelines(settings, TOPICS))["nodes"]}
    assert sorted(nodes) == ["inv.customers/columns", "inv.customers/history", "inv.customers/table_shape"]
    assert nodes["inv.customers/history"]["key"] == ["id"]
    assert nodes["inv.customers/history"]["properties"]["history_table"] == "customers_history"
    assert nodes["inv.customers/table_shape"]["properties"]["deletes"] == "soft"
    assert nodes["inv.customers/columns"]["properties"]["mask"] == {"email": "sha256"}
    lines = _table_pipelines(settings)  # validate's lines, no cluster needed
    assert lines[0] == "pipeline inv.customers:"
    assert any("inv.customers/history" in line and "history_mode=scd2" in line for line in lines), lines
    assert any("inv.customers/table_shape" in line and "deletes=soft" in line for line in lines), lines
    assert _table_pipelines(_settings({})) == []


def test_an_expression_problem_of_a_table_pipeline_names_the_database_and_table():
    settings = _settings({"customers": {"primary_key": "id", "columns": {"filter": "x"}}})
    assert naming_tables(["pipeline inv.customers: columns: filter: 'x' does not compile: E",
                          "pipeline people: columns: a: 'y' does not compile: E"], settings) == [
        "database inv, table customers: columns: filter: 'x' does not compile: E",
        "pipeline people: columns: a: 'y' does not compile: E"]


@pytest.mark.parametrize(("before", "after", "change"), [
    ({"table_shape": {"deletes": "soft"}}, {"table_shape": {"deletes": "hard"}, "history": "scd2"},
     "deletes changed from 'soft' to 'hard'"),
    ({"table_shape": {"partition_by": ["region"]}}, {"table_shape": {"partition_by": ["country"]}},
     "partition_by changed from ['region'] to ['country']"),
    ({"history": "scd2"}, {"history": {"track_history_column_list": ["name"]}},
     "track_history_column_list changed from None to ['name']"),
    ({"history": "scd2"}, {"columns": {"exclude": ["email"]}}, "'inv.customers/history' was removed"),
    ({"history": "scd2", "columns": {"exclude": ["email"]}}, {"history": "scd2", "columns": {"exclude": ["name"]}},
     "exclude changed from ['email'] to ['name']"),
])
def test_changing_a_started_tables_history_or_shape_is_refused_as_for_a_pipeline(tmp_path, before, after, change):
    def pipeline(override: dict) -> Any:
        settings = _settings({"customers": {"primary_key": ["id"], **override}}, root=tmp_path)
        return with_table_pipelines(settings, TOPICS).pipelines[0]

    start_pipeline(tmp_path, pipeline(before))
    with pytest.raises(ConfigError) as refused:
        check_and_store_pipeline(pipeline(after), str(tmp_path / "inv.customers"))
    assert "pipeline inv.customers" in str(refused.value) and change in str(refused.value)


def test_a_shape_given_to_a_table_the_shared_query_has_written_is_refused(tmp_path):
    store_routes(str(tmp_path / "inv"), {"db1.public.customers": "customers", "db1.public.orders": "orders"})
    check_table_queries(_settings({}, root=tmp_path))  # the same tables in the shared query: fine
    check_table_queries(_settings({"orders": {"primary_key": "id", "sequence_by": ["v"]}}, root=tmp_path))  # state
    with pytest.raises(ConfigError, match="database inv, table customers: history, table_shape given to a table the "
                                          "database's query has already written in the default shape"):
        check_table_queries(_settings({"customers": {"primary_key": "id", "history": "scd2",
                                                     "table_shape": {"deletes": "soft"}}}, root=tmp_path))
    # a routing that no longer sends the topic to that table: the table keeps what it has
    check_table_queries(_settings({"customers": SHAPED}, root=tmp_path, exclude=["customers"]))


def test_a_started_shaped_table_going_back_to_the_shared_query_is_refused(tmp_path):
    shaped = _settings({"customers": SHAPED}, root=tmp_path)
    start_pipeline(tmp_path, with_table_pipelines(shaped, TOPICS).pipelines[0])
    check_table_queries(shaped)
    with pytest.raises(ConfigError, match=r"database inv, table customers: its own query has started with "
                                          r"inv.customers/columns, inv.customers/history, inv.customers/table_shape"):
        check_table_queries(_settings({}, root=tmp_path))
    check_table_queries(_settings({}, root=tmp_path, exclude=["customers"]))  # excluded: it keeps what it has
    stored = json.loads((tmp_path / "inv.customers" / "plan.json").read_text())
    assert {node["kind"] for node in stored["nodes"]} == {"history", "table_shape", "columns"}
