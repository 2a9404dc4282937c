"""The engine-neutral MERGE plan and the delta-spark settings it runs with: pure logic, no JVM."""

from __future__ import annotations

import re
from importlib.metadata import version

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.delta.delta_spark import (
    DELTA_CATALOG,
    DELTA_EXTENSION,
    TXN_APP_ID_CONF,
    TXN_VERSION_CONF,
    delta_artifact,
    delta_spark_conf,
    normalize_cdf,
    txn_conf,
)
from connectors.delta.engines import open_table
from connectors.delta.merge_plan import (
    DELETE_FLAG,
    MergePlanError,
    keep_flag,
    plan_merge,
    quote,
)
from connectors.maven_jars import DELTA_VERSION
from vocabulary.errors import ConfigError


def _schema(*names: str, types: dict[str, pa.DataType] | None = None) -> pa.Schema:
    types = types or {}
    fields = [pa.field(n, pa.bool_() if n == DELETE_FLAG or n.startswith("_cdc_keep__") else types.get(n, pa.string()))
              for n in names]
    return pa.schema(fields)


def _unquote(identifier: str) -> str:
    """Read one backtick-quoted identifier back, as a SQL parser does."""
    assert identifier.startswith("`") and identifier.endswith("`")
    body = identifier[1:-1]
    assert re.fullmatch(r"(?:[^`]|``)*", body), "a lone backtick would end the identifier early"
    return body.replace("``", "`")


@given(st.text(min_size=1))
def test_quoting_reads_back_as_the_same_name(name):
    assert _unquote(quote(name)) == name


def test_predicate_quotes_odd_key_names():
    odd = ["te`nant", "order id", "a.b", "zählung"]
    plan = plan_merge(_schema(*odd, "v", DELETE_FLAG), odd)
    assert plan.predicate == (
        "t.`te``nant` = s.`te``nant` AND t.`order id` = s.`order id` "
        "AND t.`a.b` = s.`a.b` AND t.`zählung` = s.`zählung`"
    )
    assert (plan.source_alias, plan.target_alias) == ("s", "t")


def test_clauses_delete_update_insert_and_control_columns_never_assigned():
    plan = plan_merge(_schema("id", "name", DELETE_FLAG), ["id"])
    assert [c.kind for c in plan.clauses] == ["delete", "update", "insert"]
    assert plan.delete.condition == "s.`_cdc_delete`" and plan.delete.assignments == ()
    assert plan.update.condition == plan.insert.condition == "NOT s.`_cdc_delete`"
    expected = {"`id`": "s.`id`", "`name`": "s.`name`"}
    assert plan.update.mapping() == plan.insert.mapping() == expected
    assert plan.update.mapping(quote_columns=False) == {"id": "s.`id`", "name": "s.`name`"}
    assert plan.data_columns == ("id", "name") and plan.keep_columns == ()


def test_keep_flags_keep_the_stored_value_on_update_and_insert_null():
    names = ("id", "bio", "odd `col`", DELETE_FLAG, keep_flag("bio"), keep_flag("odd `col`"))
    plan = plan_merge(_schema(*names), ["id"])
    assert plan.keep_columns == ("bio", "odd `col`")
    assert plan.data_columns == ("id", "bio", "odd `col`")
    update, insert = plan.update.mapping(), plan.insert.mapping()
    assert update["`bio`"] == "CASE WHEN s.`_cdc_keep__bio` THEN t.`bio` ELSE s.`bio` END"
    assert update["`odd ``col```"] == (
        "CASE WHEN s.`_cdc_keep__odd ``col``` THEN t.`odd ``col``` ELSE s.`odd ``col``` END"
    )
    assert insert["`bio`"] == "CASE WHEN s.`_cdc_keep__bio` THEN NULL ELSE s.`bio` END"
    assert update["`id`"] == insert["`id`"] == "s.`id`"
    assert not any("_cdc_keep__" in column for column in update)


def test_new_columns_are_the_data_columns_the_target_lacks():
    source = _schema("id", "name", "email", DELETE_FLAG, keep_flag("name"), types={"email": pa.int64()})
    target = pa.schema([("id", pa.string()), ("name", pa.string()), ("old", pa.string())])
    plan = plan_merge(source, ["id"], target)
    assert plan.new_columns == (pa.field("email", pa.int64()),)
    assert plan_merge(source, ["id"], None).new_columns == ()


@pytest.mark.parametrize(
    ("names", "key", "message"),
    [
        (("id", "v"), ["id"], r"no '_cdc_delete' column"),
        (("id", DELETE_FLAG), [], r"at least one primary key"),
        (("id", DELETE_FLAG), ["tenant", "id"], r"\['tenant'\] not in the batch"),
        (("id", DELETE_FLAG, keep_flag("gone")), ["id"], r"keep flag\(s\) for column\(s\) \['gone'\]"),
        (("id", "v", DELETE_FLAG, keep_flag("id")), ["id"], r"\['id'\] cannot keep a stored value"),
    ],
)
def test_batches_that_cannot_form_a_merge_are_refused(names, key, message):
    with pytest.raises(MergePlanError, match=message):
        plan_merge(_schema(*names), key)


def test_delta_spark_conf_uses_the_maven_package_of_the_jar_cache_or_local_jars():
    artifact = delta_artifact()
    assert artifact == f"io.delta:delta-spark_2.13:{DELTA_VERSION}"
    assert version("delta_spark") == DELTA_VERSION  # the Python package matches the jars
    packaged = delta_spark_conf()
    assert packaged == {
        "spark.sql.extensions": DELTA_EXTENSION,
        "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
        "spark.jars.packages": artifact,
    }
    local = delta_spark_conf(["/opt/jars/delta-spark.jar", "/opt/jars/delta-storage.jar"])
    assert local["spark.jars"] == "/opt/jars/delta-spark.jar,/opt/jars/delta-storage.jar"
    assert "spark.jars.packages" not in local


def test_txn_conf_names_the_app_and_the_batch():
    assert txn_conf("cdc-lakehouse/p/t/q1", 7) == {TXN_APP_ID_CONF: "cdc-lakehouse/p/t/q1", TXN_VERSION_CONF: "7"}
    assert TXN_APP_ID_CONF == "spark.databricks.delta.write.txnAppId"
    assert TXN_VERSION_CONF == "spark.databricks.delta.write.txnVersion"
    with pytest.raises(ValueError, match="-1"):
        txn_conf("app", -1)


def test_normalize_cdf_plain_strings_and_utc_microseconds():
    raw = pa.table({
        "name": pa.array(["a"], pa.large_string()),
        "_change_type": pa.array(["insert"], pa.string_view()),
        "_commit_timestamp": pa.array([1_700_000_000_123], pa.timestamp("ms", tz="Europe/Paris")),
        "local": pa.array([5], pa.timestamp("ms")),
    })
    out = normalize_cdf(raw)
    assert out.schema.field("name").type == pa.string()
    assert out.schema.field("_change_type").type == pa.string()
    assert out.schema.field("_commit_timestamp").type == pa.timestamp("us", tz="UTC")
    assert out.schema.field("local").type == pa.timestamp("ms")
    assert out.column("_commit_timestamp").cast(pa.int64()).to_pylist() == [1_700_000_000_123_000]


def test_open_table_picks_the_engine_and_refuses_what_it_cannot_open(tmp_path):
    from connectors.delta.delta_rs import DeltaRsTable

    table = open_table("delta-rs", str(tmp_path / "t"), {"k": "v"})
    assert isinstance(table, DeltaRsTable) and table.storage_options == {"k": "v"}
    with pytest.raises(ConfigError, match="needs a Spark session"):
        open_table("delta-spark", str(tmp_path / "t"))
    with pytest.raises(ConfigError, match="'iceberg' is not one of delta-rs, delta-spark"):
        open_table("iceberg", str(tmp_path / "t"))  # type: ignore[arg-type]
