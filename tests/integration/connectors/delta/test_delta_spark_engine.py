"""The delta-spark engine conforms to the delta-rs engine: same scenarios, same tables.

Every scenario of `delta_engine_scenarios` runs through both engines, `DeltaRsTable` and
`DeltaSparkTable` (in the test run's one Spark session, which carries the Delta jars), against
the same written-out expectations; the tables are read back with delta-rs, and delta-spark's
change feed with both readers.
"""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from connectors.delta.delta_rs import DeltaRsTable, DeltaSchemaError
from connectors.delta.delta_spark import DeltaSparkTable, _class_loaded, missing_delta_reason
from connectors.delta.engines import open_table
from tests.support import delta_engine_scenarios as scenarios

EXPECTED = {
    "merge_evolve": {
        "before": [None, None, None],
        "rows": [
            {"te-nant": "t", "id": 1, "name": "a2", "odd-col.x": "o1", "email": "a@x"},
            {"te-nant": "t", "id": 3, "name": "c", "odd-col.x": None, "email": None},
        ],
        "columns": [*scenarios.DATA.names, "email"],  # control columns never reach the table
        "last_batch": 1,
        "cdf": "true",
    },
    "merge_with_truncate": {
        "rows": [
            {"te-nant": "t", "id": 1, "name": "a3", "odd-col.x": "o3"},
            {"te-nant": "t", "id": 5, "name": "e", "odd-col.x": None},
        ],
        "one_commit": True,
        "last_batch": 1,
    },
    "truncate": {"rows": [], "last_batch": 1, "missing": None},
    "merge_sink_truncates": {
        "after_merge": [[2, "b2"], [3, "c"]],
        "after_truncate": [],
        "last_batch": 2,
        "outcomes": [[2, 0, False, False], [2, 0, False, True], [0, 0, False, True], [0, 0, True, False]],
    },
}


@pytest.fixture(params=["delta-rs", "delta-spark"])
def open_engine(request: pytest.FixtureRequest) -> scenarios.OpenEngine:
    """Opens a table with one engine (delta-spark in the test run's session)."""
    if request.param == "delta-rs":
        return DeltaRsTable
    spark = request.getfixturevalue("spark")
    return lambda uri: DeltaSparkTable(spark, uri)


def test_every_scenario_has_an_expectation():
    assert set(EXPECTED) == set(scenarios.SCENARIOS)


@pytest.mark.parametrize("scenario", sorted(scenarios.SCENARIOS))
def test_engine_conforms(open_engine, scenario, tmp_path):
    assert scenarios.observe(scenario, open_engine, tmp_path) == EXPECTED[scenario]


def test_the_test_session_runs_delta_spark(spark, tmp_path):
    assert missing_delta_reason(spark) is None
    assert _class_loaded(spark, "org.apache.spark.sql.SparkSession")
    assert not _class_loaded(spark, "io.delta.tables.NoSuchClass")
    assert isinstance(open_table("delta-spark", str(tmp_path / "t"), None, spark), DeltaSparkTable)


def test_delta_spark_change_feed_matches_delta_rs(spark, tmp_path):
    scenarios.observe("merge_evolve", DeltaRsTable, tmp_path / "rs")
    reference = scenarios.change_feed(str(tmp_path / "rs" / "t"))
    scenarios.observe("merge_evolve", lambda uri: DeltaSparkTable(spark, uri), tmp_path / "spark")
    table = DeltaSparkTable(spark, str(tmp_path / "spark" / "t"))
    feed = table.load_cdf(0)  # delta-spark's own reader
    assert feed.schema.field("_commit_timestamp").type == pa.timestamp("us", tz="UTC")
    by_spark = sorted([r["_change_type"], r["id"], r["name"]] for r in feed.to_pylist())
    assert by_spark == scenarios.change_feed(table.uri) == reference
    assert {"insert", "update_preimage", "update_postimage", "delete"} <= {c for c, _, _ in reference}


def test_delta_spark_skips_a_replayed_batch_by_its_transaction(spark, tmp_path):
    """Delta itself (session settings txnAppId / txnVersion) skips a MERGE whose batch the table holds."""
    table = DeltaSparkTable(spark, str(tmp_path / "t"))
    table.create(scenarios.DATA)
    table.merge(scenarios.FIRST, scenarios.KEY, scenarios.APP, 0)
    version = table.version()
    table.merge(scenarios.batch([{"te-nant": "t", "id": 1}], deletes=[True]), scenarios.KEY, scenarios.APP, 0)
    assert table.version() == version
    assert [r["id"] for r in scenarios.rows(table.uri)] == [1, 2]


def test_delta_spark_tables_keep_their_log_on_commit(spark, tmp_path):
    table = DeltaSparkTable(spark, str(tmp_path / "t"))
    table.create(scenarios.DATA)
    assert DeltaTable(table.uri).metadata().configuration["delta.enableExpiredLogCleanup"] == "false"


def test_delta_spark_turns_off_commit_log_cleanup_on_a_table_delta_rs_created(spark, tmp_path):
    uri = str(tmp_path / "t")
    DeltaRsTable(uri).create(scenarios.DATA)
    assert "delta.enableExpiredLogCleanup" not in DeltaTable(uri).metadata().configuration
    DeltaSparkTable(spark, uri).merge(scenarios.FIRST, scenarios.KEY, scenarios.APP, 0)
    assert DeltaTable(uri).metadata().configuration["delta.enableExpiredLogCleanup"] == "false"
    assert [r["id"] for r in scenarios.rows(uri)] == [1, 2]


def test_a_second_engine_table_object_sees_the_first_ones_commits(spark, tmp_path: Path):
    """Two handles on one table (e.g. a restarted pipeline) agree on version and last batch."""
    first = DeltaSparkTable(spark, str(tmp_path / "t"))
    first.create(scenarios.DATA)
    first.merge(scenarios.FIRST, scenarios.KEY, scenarios.APP, 3)
    second = DeltaSparkTable(spark, first.uri)
    assert (second.version(), second.last_batch(scenarios.APP)) == (first.version(), 3)


@pytest.mark.parametrize("odd", ["te`nant", "odd col", "a,b", "x=y"])
def test_names_delta_spark_cannot_store_merge_on_delta_rs_and_are_refused_clearly_on_delta_spark(spark, tmp_path, odd):
    schema = pa.schema([(odd, pa.string()), *list(scenarios.DATA)[1:]])
    first = scenarios.FIRST.rename_columns([odd, *scenarios.FIRST.column_names[1:]])
    key = (odd, "id")
    rs = DeltaRsTable(str(tmp_path / "rs"))
    rs.create(schema)
    rs.merge(first, key, scenarios.APP, 0)
    assert [(r[odd], r["id"]) for r in scenarios.rows(rs.uri)] == [("t", 1), ("t", 2)]
    refused = rf"delta-spark cannot write columns named \[{re.escape(repr(odd))}\]"
    with pytest.raises(DeltaSchemaError, match=refused):
        DeltaSparkTable(spark, str(tmp_path / "spark")).create(schema)
    with pytest.raises(DeltaSchemaError, match=refused):  # a table delta-rs created
        DeltaSparkTable(spark, rs.uri).merge(first, key, scenarios.APP, 1)
    assert DeltaRsTable(rs.uri).last_batch(scenarios.APP) == 0
