"""A database source's routing: topics -> tables, include / exclude, the names a pattern must capture."""

from __future__ import annotations

import pytest

from service.config.settings import settings_from_mapping
from vocabulary.errors import ConfigError

PATTERN = r"db1\.(?P<schema>[^.]+)\.(?P<table>[^.]+)"


def _database(**extra):
    data = {"name": "inv", "topic_pattern": PATTERN, "table_name": "{schema}_{table}", **extra}
    return settings_from_mapping({"databases": [data]}).databases[0]


def test_topics_route_to_tables_by_the_patterns_groups():
    database = _database()
    routes = database.routes(["db1.public.orders", "db1.sales.orders", "db1.public", "xdb1.public.a",
                              "__consumer_offsets", "db1.public.orders.extra"])
    assert routes == {"db1.public.orders": "public_orders", "db1.sales.orders": "sales_orders"}


def test_include_and_exclude_are_patterns_over_table_names():
    database = _database(include=["public_.*"], exclude=["public_audit.*"])
    assert database.routes(["db1.public.orders", "db1.public.audit_log", "db1.sales.orders"]) == {
        "db1.public.orders": "public_orders"}


def test_two_topics_naming_one_table_are_refused():
    database = _database(table_name="{table}")
    with pytest.raises(ValueError, match="both name table 'orders'"):
        database.routes(["db1.public.orders", "db1.sales.orders"])


def test_a_table_named_as_another_tables_history_is_refused():
    history = {"mode": "scd2", "sequence_by": "ts"}
    database = _database(tables={"public_orders": {"primary_key": ["id"], "history": history}})
    topics = ["db1.public.orders", "db1.public.orders_history"]
    with pytest.raises(ValueError, match="'public_orders' .* keeps its history in table 'public_orders_history', "
                                         "which topic 'db1.public.orders_history' also names"):
        database.routes(topics)
    named = _database(tables={"public_orders": {"primary_key": ["id"],
                                                "history": {**history, "table": "orders_versions"}}})
    assert named.routes(topics) == {"db1.public.orders": "public_orders",
                                    "db1.public.orders_history": "public_orders_history"}


def test_table_name_may_only_use_captured_groups():
    with pytest.raises(ConfigError, match="uses db, which topic_pattern does not capture"):
        _database(table_name="{db}_{table}")


def test_a_pattern_that_does_not_compile_is_refused():
    with pytest.raises(ConfigError, match="not a regular expression"):
        _database(topic_pattern="db1.(")


def test_database_names_share_the_namespace_of_pipelines():
    with pytest.raises(ConfigError, match="repeated: inv"):
        settings_from_mapping({
            "databases": [{"name": "inv", "topic_pattern": PATTERN}],
            "pipelines": [{"name": "inv", "topics": ["t"], "table": "t", "primary_key": ["id"]}],
        })


def test_per_table_overrides_and_defaults():
    database = _database(tables={"public_log": {"primary_key": "log_id"}})
    assert database.override("public_log").primary_key == ("log_id",)
    assert database.override("public_orders").primary_key is None
    assert database.on_table_error == "stop" and database.schema_changes == "lenient"
