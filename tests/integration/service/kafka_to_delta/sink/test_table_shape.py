"""The MERGE sink under a pipeline's table_shape on both Delta engines: soft deletes, kept values
(the unavailable-value placeholder and ignore_null_updates: one mechanism, one test), partitioning and
clustering; every table read back with the delta-rs reader and, for delta-spark, with Spark too."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from connectors.delta.delta_rs import DeltaRsTable, DeltaSchemaError
from connectors.delta.delta_spark import DeltaSparkTable
from service.config.table_shape import DELETED, DELETED_AT, TableShape
from service.kafka_to_delta.rows.names import Meta
from service.kafka_to_delta.sink.merge_sink import MergeSink
from vocabulary.changes import ChangeKind

APP = "shape-app"
T0, T1, T2 = 1_700_000_000_000, 1_700_000_100_000, 1_700_000_200_000
SCHEMA = pa.schema([("id", pa.int64()), ("body", pa.string()), ("rev", pa.int64())])


def _typed(changes: list[tuple[ChangeKind, dict, int, list[str] | None]], first_offset: int = 0) -> pa.Table:
    """Typed net changes as the plain path hands them to the sink: (kind, row, Kafka timestamp ms,
    columns left unchanged by the source or None); a delete's row holds its key alone."""
    rows = [{name: row.get(name) for name in SCHEMA.names} for _, row, _, _ in changes]
    table = pa.Table.from_pylist(rows, SCHEMA)
    n = len(changes)
    meta = {
        Meta.KEY: pa.array([json.dumps([row["id"]]) for row in rows]),
        Meta.KIND: pa.array([kind.value for kind, _, _, _ in changes]),
        Meta.TOPIC: pa.array(["t"] * n), Meta.PARTITION: pa.array([0] * n, pa.int32()),
        Meta.OFFSET: pa.array(range(first_offset, first_offset + n), pa.int64()),
        Meta.CHANGE_INDEX: pa.array([0] * n, pa.int32()),
        Meta.TIMESTAMP: pa.array([ts for _, _, ts, _ in changes], pa.int64()),
        Meta.UNCHANGED: pa.array([json.dumps(u) if u else None for _, _, _, u in changes], pa.string()),
    }
    for name in Meta.ALL:
        table = table.append_column(name, meta[name])
    return table


def _read(engine, uri: str) -> list[list[dict]]:
    """The table's rows by id, as each Delta reader of the engine sees them (delta-rs always)."""
    _, read_back = engine
    readers = [DeltaTable(uri).to_pyarrow_table(), read_back(uri)]
    return [sorted(t.to_pylist(), key=lambda r: r["id"]) for t in readers]


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, timezone.utc)


def test_soft_deletes_keep_the_row_flagged_and_a_reinsert_clears_it(engine, tmp_path):
    open_table, _ = engine
    uri = str(tmp_path / "t")
    sink = MergeSink(open_table(uri), ("id",), shape=TableShape(deletes="soft"))
    sink.apply_typed(_typed([(ChangeKind.INSERT, {"id": 1, "body": "a", "rev": 1}, T0, None),
                             (ChangeKind.INSERT, {"id": 2, "body": "b", "rev": 1}, T0, None)]), APP, 0)
    deletes = _typed([(ChangeKind.DELETE, {"id": 2}, T1, None),
                      (ChangeKind.UPDATE_AFTER, {"id": 1, "body": "a2", "rev": 2}, T1, None),
                      (ChangeKind.DELETE, {"id": 9}, T1, None)], 2)
    outcome = sink.apply_typed(deletes, APP, 1)
    assert (outcome.upserts, outcome.deletes) == (1, 2)
    live = {DELETED: False, DELETED_AT: None}
    expected = [{"id": 1, "body": "a2", "rev": 2, **live},
                {"id": 2, "body": "b", "rev": 1, DELETED: True, DELETED_AT: _at(T1)},
                {"id": 9, "body": None, "rev": None, DELETED: True, DELETED_AT: _at(T1)}]
    for rows in _read(engine, uri):
        assert rows == expected
    version = DeltaTable(uri).version()
    assert sink.apply_typed(deletes, APP, 1).skipped_replay and DeltaTable(uri).version() == version
    sink.apply_typed(_typed([(ChangeKind.INSERT, {"id": 2, "body": "b2", "rev": 3}, T2, None)], 5), APP, 2)
    for rows in _read(engine, uri):
        assert rows[1] == {"id": 2, "body": "b2", "rev": 3, **live}
    feed = pa.table(DeltaTable(uri).load_cdf(starting_version=version + 1).read_all()).to_pylist()
    kinds = {(r["id"], r["_change_type"], r[DELETED]) for r in feed}
    assert kinds == {(2, "update_preimage", True), (2, "update_postimage", False)}
    everything = pa.table(DeltaTable(uri).load_cdf(starting_version=0).read_all()).column("_change_type").to_pylist()
    assert "delete" not in everything and "update_postimage" in everything


@pytest.mark.parametrize("mechanism", ["placeholder", "null"])
def test_a_kept_column_keeps_the_stored_value(engine, tmp_path, mechanism):
    """The unavailable-value placeholder and ignore_null_updates keep a stored value the same way; an
    insert has none to keep; without ignore_null_updates a null overwrites."""
    open_table, _ = engine
    uri = str(tmp_path / "t")
    sink = MergeSink(open_table(uri), ("id",), shape=TableShape(ignore_null_updates=mechanism == "null"))
    sink.apply_typed(_typed([(ChangeKind.INSERT, {"id": 1, "body": "large text", "rev": 1}, T0, None),
                             (ChangeKind.INSERT, {"id": 2, "body": "other", "rev": 1}, T0, None)]), APP, 0)
    unchanged = ["body"] if mechanism == "placeholder" else None
    sink.apply_typed(_typed([(ChangeKind.UPDATE_AFTER, {"id": 1, "rev": 2}, T1, unchanged),
                             (ChangeKind.UPDATE_AFTER, {"id": 2, "body": "new", "rev": 2}, T1, None),
                             (ChangeKind.INSERT, {"id": 3, "rev": 1}, T1, unchanged)], 2), APP, 1)
    expected = [{"id": 1, "body": "large text", "rev": 2}, {"id": 2, "body": "new", "rev": 2},
                {"id": 3, "body": None, "rev": 1}]
    for rows in _read(engine, uri):
        assert rows == expected
    plain = MergeSink(open_table(str(tmp_path / "plain")), ("id",))
    plain.apply_typed(_typed([(ChangeKind.INSERT, {"id": 1, "body": "large text", "rev": 1}, T0, None)]), APP, 0)
    plain.apply_typed(_typed([(ChangeKind.UPDATE_AFTER, {"id": 1, "rev": 2}, T1, None)], 1), APP, 1)
    assert DeltaTable(str(tmp_path / "plain")).to_pyarrow_table().to_pylist() == [{"id": 1, "body": None, "rev": 2}]


def test_soft_deletes_with_ignore_null_updates(engine, tmp_path):
    open_table, _ = engine
    uri = str(tmp_path / "t")
    sink = MergeSink(open_table(uri), ("id",), shape=TableShape(deletes="soft", ignore_null_updates=True))
    sink.apply_typed(_typed([(ChangeKind.INSERT, {"id": 1, "body": "a", "rev": 1}, T0, None)]), APP, 0)
    sink.apply_typed(_typed([(ChangeKind.DELETE, {"id": 1}, T1, None)], 1), APP, 1)
    sink.apply_typed(_typed([(ChangeKind.INSERT, {"id": 1, "rev": 2}, T2, None)], 2), APP, 2)
    for rows in _read(engine, uri):
        assert rows == [{"id": 1, "body": "a", "rev": 2, DELETED: False, DELETED_AT: None}]


def test_partition_by_lays_out_the_new_table(engine, tmp_path):
    open_table, _ = engine
    uri = str(tmp_path / "t")
    sink = MergeSink(open_table(uri), ("id",), shape=TableShape(partition_by=("body",)))
    sink.apply_typed(_typed([(ChangeKind.INSERT, {"id": i, "body": f"p{i % 2}", "rev": i}, T0, None)
                             for i in range(4)]), APP, 0)
    sink.apply_typed(_typed([(ChangeKind.DELETE, {"id": 0}, T1, None),
                             (ChangeKind.UPDATE_AFTER, {"id": 1, "body": "p1", "rev": 9}, T1, None)], 4), APP, 1)
    assert DeltaTable(uri).metadata().partition_columns == ["body"]
    files = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).column("path").to_pylist()
    assert sorted({f.split("/")[0] for f in files}) == ["body=p0", "body=p1"]
    for rows in _read(engine, uri):
        assert rows == [{"id": 1, "body": "p1", "rev": 9}, {"id": 2, "body": "p0", "rev": 2},
                        {"id": 3, "body": "p1", "rev": 3}]


def test_a_layout_column_the_table_lacks_is_refused_naming_the_table(tmp_path):
    uri = str(tmp_path / "t")
    sink = MergeSink(DeltaRsTable(uri), ("id",), shape=TableShape(partition_by=("region",)))
    with pytest.raises(DeltaSchemaError, match=r"t: table_shape.partition_by column\(s\) \['region'\]"):
        sink.apply_typed(_typed([(ChangeKind.INSERT, {"id": 1, "body": "a", "rev": 1}, T0, None)]), APP, 0)


def test_cluster_by_clusters_the_new_table_on_delta_spark(spark, tmp_path):
    uri = str(tmp_path / "t")
    sink = MergeSink(DeltaSparkTable(spark, uri), ("id",), shape=TableShape(cluster_by=("rev",)))
    sink.apply_typed(_typed([(ChangeKind.INSERT, {"id": 1, "body": "a", "rev": 1}, T0, None)]), APP, 0)
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{uri}`").collect()[0]
    assert list(detail["clusteringColumns"]) == ["rev"]
    assert DeltaTable(uri).to_pyarrow_table().to_pylist() == [{"id": 1, "body": "a", "rev": 1}]
