"""The delta-spark engine against real Delta tables, compared with delta-rs running the same plan.

The plan's SQL is first executed by delta-rs (runs everywhere): that is the reference
result. Where the Delta jars can be put on the Spark classpath (found on disk, or Maven
Central answers), DeltaSparkTable must produce the same table, skip replays and read the
same change feed; elsewhere those tests skip, naming why. Detection itself always runs.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import urllib.request
from importlib.metadata import version
from pathlib import Path

import pyarrow as pa
import pyspark
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction

from connectors.delta.delta_rs import DeltaRsTable
from connectors.delta.delta_spark import (
    DeltaSparkTable,
    DeltaSparkUnavailable,
    _class_loaded,
    delta_artifact,
    delta_spark_conf,
    missing_delta_reason,
)
from connectors.delta.engines import open_table
from connectors.delta.merge_plan import DELETE_FLAG, keep_flag, plan_merge
from service.changes import ChangeKind
from service.kafka_to_delta.merge_sink import MergeSink

APP = "cdc-lakehouse/test/engine"
KEY = ("te`nant", "id")
UNAVAILABLE = "__debezium_unavailable_value"
_MAVEN = "https://repo1.maven.org/maven2"
_PROBE_TIMEOUT_S = 3.0
DATA = pa.schema([("te`nant", pa.string()), ("id", pa.int64()), ("name", pa.string()), ("odd col.x", pa.string())])


def _batch(rows: list[dict], deletes: list[bool], kept: list[bool], email: list | None = None) -> pa.Table:
    """Net changes with the control columns: delete flag and a keep flag for `odd col.x`."""
    columns = {f.name: pa.array([r.get(f.name) for r in rows], f.type) for f in DATA}
    if email is not None:
        columns["email"] = pa.array(email, pa.string())
    columns[DELETE_FLAG] = pa.array(deletes, pa.bool_())
    columns[keep_flag("odd col.x")] = pa.array(kept, pa.bool_())
    return pa.table(columns)


FIRST = _batch(
    [
        {"te`nant": "t", "id": 1, "name": "a", "odd col.x": "o1"},
        {"te`nant": "t", "id": 2, "name": "b", "odd col.x": "o2"},
    ],
    deletes=[False, False], kept=[False, False],
)
SECOND = _batch(
    [
        {"te`nant": "t", "id": 1, "name": "a2", "odd col.x": UNAVAILABLE},  # unchanged TOAST value: keep o1
        {"te`nant": "t", "id": 2},
        {"te`nant": "t", "id": 3, "name": "c", "odd col.x": UNAVAILABLE},  # nothing stored to keep: NULL
    ],
    deletes=[False, True, False], kept=[True, False, True], email=["a@x", None, None],
)
EXPECTED = [
    {"te`nant": "t", "id": 1, "name": "a2", "odd col.x": "o1", "email": "a@x"},
    {"te`nant": "t", "id": 3, "name": "c", "odd col.x": None, "email": None},
]


def _rows(uri: str) -> list[dict]:
    return sorted(DeltaTable(uri).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])


def _delta_rs_merge(uri: str, changes: pa.Table, app_id: str, batch_id: int) -> None:
    """The plan executed by delta-rs: the reference every engine must match."""
    table = DeltaTable(uri)
    last = table.transaction_version(app_id)
    if last is not None and last >= batch_id:
        return
    plan = plan_merge(changes.schema, KEY, pa.schema(table.schema().to_arrow()))
    commit = CommitProperties(app_transactions=[Transaction(app_id, batch_id)])
    (
        table.merge(changes, plan.predicate, source_alias=plan.source_alias, target_alias=plan.target_alias,
                    merge_schema=True, commit_properties=commit)
        .when_matched_delete(predicate=plan.delete.condition)
        .when_matched_update(updates=plan.update.mapping(), predicate=plan.update.condition)
        .when_not_matched_insert(updates=plan.insert.mapping(), predicate=plan.insert.condition)
        .execute()
    )


def _reference(uri: str) -> None:
    DeltaTable.create(uri, DATA, configuration={"delta.enableChangeDataFeed": "true"})
    _delta_rs_merge(uri, FIRST, APP, 0)
    _delta_rs_merge(uri, SECOND, APP, 1)
    _delta_rs_merge(uri, FIRST, APP, 1)  # a replay: skipped


def test_the_plan_run_by_delta_rs_deletes_updates_inserts_keeps_and_evolves(tmp_path):
    uri = str(tmp_path / "reference")
    _reference(uri)
    assert _rows(uri) == EXPECTED
    names = DeltaTable(uri).schema().to_arrow().names
    assert names == [*DATA.names, "email"]  # control columns never reach the table
    assert DeltaTable(uri).transaction_version(APP) == 1
    assert DeltaTable(uri).version() == 2


# --- detection: always runs ------------------------------------------------------------------


def test_the_engine_opens_only_where_the_delta_classes_load(spark, tmp_path):
    assert _class_loaded(spark, "org.apache.spark.sql.SparkSession")
    assert not _class_loaded(spark, "io.delta.tables.NoSuchClass")
    reason = missing_delta_reason(spark)
    uri = str(tmp_path / "t")
    if reason is None:
        assert isinstance(open_table("delta-spark", uri, None, spark), DeltaSparkTable)
        return
    assert "io.delta.tables.DeltaTable" in reason and delta_artifact() in reason
    with pytest.raises(DeltaSparkUnavailable, match=r"cannot open .*/t with delta-spark: the Delta Lake jars"):
        DeltaSparkTable(spark, uri)
    with pytest.raises(DeltaSparkUnavailable):
        open_table("delta-spark", uri, None, spark)


# --- conformance: needs the Delta jars -------------------------------------------------------


def _local_delta_jars() -> list[str]:
    """The delta-spark and delta-storage jars of the installed version, if on this machine."""
    delta_version = version("delta_spark")
    major_minor = ".".join(pyspark.__version__.split(".")[:2])
    wanted = (f"delta-spark_{major_minor}_2.13-{delta_version}.jar", f"delta-storage-{delta_version}.jar")
    home = Path.home()
    places = [Path(pyspark.__file__).parent / "jars", home / ".ivy2.5.2" / "jars", home / ".ivy2" / "jars"]
    if os.environ.get("SPARK_HOME"):
        places.append(Path(os.environ["SPARK_HOME"]) / "jars")
    found = {}
    for place in places:
        for name in wanted:
            if name not in found and (place / name).is_file():
                found[name] = str(place / name)
    return list(found.values()) if len(found) == len(wanted) else []


def _maven_answers() -> bool:
    """Whether Maven Central serves the Delta POM within a few seconds (DNS included)."""
    group, artifact, release = delta_artifact().split(":")
    url = f"{_MAVEN}/{group.replace('.', '/')}/{artifact}/{release}/{artifact}-{release}.pom"

    def probe() -> bool:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=_PROBE_TIMEOUT_S):
            return True

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(probe).result(timeout=_PROBE_TIMEOUT_S + 1)
    except Exception:  # noqa: BLE001 - unreachable for any reason means "no"
        return False
    finally:
        pool.shutdown(wait=False)


@pytest.fixture(scope="module")
def delta_spark():
    """A Spark session with Delta on its classpath, or a skip naming what is missing."""
    jars = _local_delta_jars()
    if not jars and not _maven_answers():
        pytest.skip(
            f"delta-spark cannot run here: the Delta jars ({delta_artifact()}) are not on this machine "
            "and Maven Central does not answer"
        )
    from service.settings import SparkSettings
    from service.spark import build_spark

    session = build_spark(SparkSettings(master="local[2]", shuffle_partitions=2, conf=delta_spark_conf(jars)))
    reason = missing_delta_reason(session)
    if reason is not None:
        pytest.skip(f"delta-spark cannot run in this test process: {reason}")
    return session


def _spark_scenario(session, uri: str) -> DeltaSparkTable:
    table = DeltaSparkTable(session, uri)
    assert table.schema() is None and table.version() is None and table.last_batch(APP) is None
    table.create(DATA)
    table.merge(FIRST, KEY, APP, 0)
    table.merge(SECOND, KEY, APP, 1)
    return table


def test_delta_spark_matches_the_delta_rs_reference(delta_spark, tmp_path):
    reference, uri = str(tmp_path / "reference"), str(tmp_path / "spark")
    _reference(reference)
    table = _spark_scenario(delta_spark, uri)
    assert _rows(uri) == _rows(reference) == EXPECTED
    assert table.schema().names == [*DATA.names, "email"]
    assert table.last_batch(APP) == 1
    assert DeltaTable(uri).metadata().configuration["delta.enableChangeDataFeed"] == "true"


def test_delta_spark_skips_a_replayed_batch_by_its_transaction(delta_spark, tmp_path):
    uri = str(tmp_path / "spark")
    table = _spark_scenario(delta_spark, uri)
    version_before = table.version()
    table.merge(FIRST, KEY, APP, 1)  # same batch id, other content: Delta must skip it
    assert table.version() == version_before and _rows(uri) == EXPECTED
    table.merge(_batch([{"te`nant": "t", "id": 3}], [True], [False]), KEY, APP, 2)
    assert [r["id"] for r in _rows(uri)] == [1] and table.last_batch(APP) == 2


def test_delta_spark_change_feed_matches_delta_rs(delta_spark, tmp_path):
    reference, uri = str(tmp_path / "reference"), str(tmp_path / "spark")
    _reference(reference)
    table = _spark_scenario(delta_spark, uri)
    spark_feed = table.load_cdf(0)
    assert spark_feed.schema.field("_commit_timestamp").type == pa.timestamp("us", tz="UTC")
    rs_feed = pa.table(DeltaTable(reference).load_cdf(starting_version=0))

    def changes(feed: pa.Table) -> list[tuple]:
        return sorted((r["_change_type"], r["id"], r["name"]) for r in feed.to_pylist())

    assert changes(spark_feed) == changes(rs_feed)
    assert {"insert", "update_preimage", "update_postimage", "delete"} <= {c for c, _, _ in changes(spark_feed)}


def test_merge_sink_writes_through_delta_spark(delta_spark, tmp_path):
    uri = str(tmp_path / "sink")
    sink = MergeSink(DeltaSparkTable(delta_spark, uri), ("id",))
    net = pa.table({
        "key": [json.dumps([1]), json.dumps([2])],
        "kind": [ChangeKind.INSERT.value, ChangeKind.INSERT.value],
        "row": [json.dumps({"id": 1, "v": "a"}), json.dumps({"id": 2, "v": "b"})],
        "types": [json.dumps({"id": "int32", "v": "string"})] * 2,
    })
    assert sink.apply(net, APP, 0).upserts == 2
    assert sink.apply(net, APP, 0).skipped_replay
    assert sorted(r["id"] for r in DeltaTable(uri).to_pyarrow_table().to_pylist()) == [1, 2]
    assert DeltaRsTable(uri).last_batch(APP) == 0
