"""The MERGE sink under a pipeline's table_shape on both Delta engines: soft deletes, kept values
(the unavailable-value placeholder), ignore_null_updates (Debezium records decoded, both ways of the
plain path, reduced and merged: the nulls of updates are markers like the placeholder), partitioning
and clustering; every table read back with the delta-rs reader and, for delta-spark, with Spark too."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from connectors.delta.delta_rs import DeltaRsTable, DeltaSchemaError
from connectors.delta.delta_spark import DeltaSparkTable
from connectors.delta.engines import open_table
from connectors.delta.table_scan import scan
from connectors.kafka.range_reader import SOURCE_SCHEMA
from service.config.settings import PipelineSettings
from service.config.table_shape import DELETED, DELETED_AT, TableShape
from service.kafka_to_delta.rows.arrow import PAYLOAD_SCHEMA
from service.kafka_to_delta.rows.names import Meta
from service.kafka_to_delta.sink.merge_sink import MergeSink
from service.kafka_to_delta.source.batch_changes import batch_changes
from service.kafka_to_delta.source.decode_stage import batch_decoder
from service.kafka_to_delta.source.partition_changes import PartitionReducer
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


def test_a_kept_column_keeps_the_stored_value(engine, tmp_path):
    """A column left unchanged (the unavailable-value placeholder, or a null of an update under
    ignore_null_updates: the decode makes both the same marker) keeps the stored value; an insert has
    none to keep; a null without the marker overwrites, with or without ignore_null_updates."""
    open_table, _ = engine
    uri = str(tmp_path / "t")
    sink = MergeSink(open_table(uri), ("id",), shape=TableShape(ignore_null_updates=True))
    sink.apply_typed(_typed([(ChangeKind.INSERT, {"id": 1, "body": "large text", "rev": 1}, T0, None),
                             (ChangeKind.INSERT, {"id": 2, "body": "other", "rev": 1}, T0, None)]), APP, 0)
    unchanged = ["body"]
    sink.apply_typed(_typed([(ChangeKind.UPDATE_AFTER, {"id": 1, "rev": 2}, T1, unchanged),
                             (ChangeKind.UPDATE_AFTER, {"id": 2, "body": "new", "rev": 2}, T1, None),
                             (ChangeKind.INSERT, {"id": 3, "rev": 1}, T1, unchanged)], 2), APP, 1)
    expected = [{"id": 1, "body": "large text", "rev": 2}, {"id": 2, "body": "new", "rev": 2},
                {"id": 3, "body": None, "rev": 1}]
    for rows in _read(engine, uri):
        assert rows == expected
    for shape in (TableShape(), TableShape(ignore_null_updates=True)):
        plain = MergeSink(open_table(str(tmp_path / f"plain{shape.ignore_null_updates}")), ("id",), shape=shape)
        plain.apply_typed(_typed([(ChangeKind.INSERT, {"id": 1, "body": "large text", "rev": 1}, T0, None)]), APP, 0)
        plain.apply_typed(_typed([(ChangeKind.UPDATE_AFTER, {"id": 1, "rev": 2}, T1, None)], 1), APP, 1)
        assert DeltaTable(plain.table.uri).to_pyarrow_table().to_pylist() == [{"id": 1, "body": None, "rev": 2}]


_BLOCK = {"type": "struct", "fields": [{"type": "int64", "optional": False, "field": "id"},
                                       {"type": "string", "optional": True, "field": "body"},
                                       {"type": "int64", "optional": True, "field": "rev"}]}
_ENVELOPE = {"type": "struct", "name": "t.Envelope", "fields": [
    {**_BLOCK, "optional": True, "field": "before"}, {**_BLOCK, "optional": True, "field": "after"},
    {"type": "string", "optional": False, "field": "op"}]}


def _change(op: str, key: int, body: str | None = None, rev: int | None = None, before: str | None = None) -> dict:
    """A Debezium change of row `key`: an insert, update (`before`: the before image's body) or delete."""
    image = {"id": key, "body": body, "rev": rev}
    if op == "d":
        return {"op": "d", "before": image, "after": None}
    return {"op": op, "before": None if before is None else {"id": key, "body": before, "rev": None},
            "after": image}


class _Ingest:
    """Micro-batches of Debezium records (Connect JSON) decoded one way of the plain path (vectorised
    or record by record), each batch's ranges reduced and merged as the pipeline does, into `sink`."""

    def __init__(self, sink: MergeSink, vectorised: bool) -> None:
        self.sink = sink
        pipeline = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"],
                                    table_shape=sink.shape.model_dump())
        self.decoder = batch_decoder(pipeline)
        self.vectorised = vectorised
        self.offset = 0
        self.batch_id = 0

    def _range(self, changes: list[dict], timestamp_ms: int) -> list[pa.RecordBatch]:
        n = len(changes)
        records = pa.RecordBatch.from_pydict({
            "key": [json.dumps({"id": c[("after" if c["after"] else "before")]["id"]}).encode() for c in changes],
            "value": [json.dumps({"schema": _ENVELOPE, "payload": c}).encode() for c in changes],
            "topic": ["t"] * n, "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(self.offset, self.offset + n), pa.int64()),
            "timestamp": pa.array([timestamp_ms * 1000] * n, pa.timestamp("us", tz="UTC")),
            "headers": pa.nulls(n, SOURCE_SCHEMA.field("headers").type), "watermark_floor": pa.nulls(n, pa.int64()),
        }, schema=SOURCE_SCHEMA)
        self.offset += n
        reducer = PartitionReducer(self.decoder, ("id",), vectorised=self.vectorised)
        return list(reducer(lambda: iter([records])))

    def batch(self, *ranges: list[dict], timestamp_ms: int = T0) -> None:
        """One micro-batch of `ranges` (consecutive pieces of one partition)."""
        payloads = [payload for changes in ranges for payload in self._range(changes, timestamp_ms)]
        found = batch_changes(pa.Table.from_batches(payloads, schema=PAYLOAD_SCHEMA))
        assert (found.vectorised, found.record_by_record) == ((len(ranges), 0) if self.vectorised else (0, len(ranges)))
        self.sink.apply_typed(found.changes, APP, self.batch_id)
        self.batch_id += 1


@pytest.mark.parametrize("vectorised", [True, False], ids=["vectorised", "record_by_record"])
def test_ignore_null_updates_does_not_depend_on_where_batches_end(engine, tmp_path, vectorised):
    """A null of an update keeps the key's latest value, from an earlier image of its batch (of the
    range, or of another range), else from the table; an insert stores its nulls; a before image's
    null is no value either (the table kept one)."""
    open_table, _ = engine
    uri = str(tmp_path / "t")
    ingest = _Ingest(MergeSink(open_table(uri), ("id",), shape=TableShape(ignore_null_updates=True)), vectorised)
    ingest.batch([_change("c", 1, "a", 1), _change("u", 1, None, 2), _change("c", 2, "b", 1),
                  _change("c", 4, None, 1)],
                 [_change("c", 3, "x", 1)], [_change("u", 3, None, 2)])
    ingest.batch([_change("u", 2, None, 2, before="b"), _change("u", 1, None, 3, before="a")])
    ingest.batch([_change("u", 1, None, 4, before=None), _change("u", 4, "y", 2, before=None)])
    ingest.batch([_change("c", 5, "e", 1), _change("u", 5, None, 2, before="e"), _change("u", 5, None, 3, before=None)])
    for rows in _read(engine, uri):
        assert rows == [{"id": 1, "body": "a", "rev": 4}, {"id": 2, "body": "b", "rev": 2},
                        {"id": 3, "body": "x", "rev": 2}, {"id": 4, "body": "y", "rev": 2},
                        {"id": 5, "body": "e", "rev": 3}]


@pytest.mark.parametrize("vectorised", [True, False], ids=["vectorised", "record_by_record"])
def test_a_reinsert_of_a_soft_deleted_key_stores_its_nulls(engine, tmp_path, vectorised):
    """With soft deletes and ignore_null_updates an insert is an insert: its nulls are stored, also
    when it re-inserts a deleted key (the stored row is the deleted one), in a later batch or in the
    delete's own batch; a later update's null keeps the re-inserted value."""
    open_table, _ = engine
    uri = str(tmp_path / "t")
    shape = TableShape(deletes="soft", ignore_null_updates=True)
    ingest = _Ingest(MergeSink(open_table(uri), ("id",), shape=shape), vectorised)
    ingest.batch([_change("c", 1, "a", 1), _change("c", 2, "b", 1), _change("c", 3, "c", 1)])
    ingest.batch([_change("d", 1, "a", 1), _change("d", 2, "b", 1), _change("c", 2, None, 2)], timestamp_ms=T1)
    ingest.batch([_change("c", 1, None, 2), _change("d", 3, "c", 1), _change("c", 3, "c2", 2),
                  _change("u", 3, None, 3, before="c2")], timestamp_ms=T2)
    live = {DELETED: False, DELETED_AT: None}
    for rows in _read(engine, uri):
        assert rows == [{"id": 1, "body": None, "rev": 2, **live}, {"id": 2, "body": None, "rev": 2, **live},
                        {"id": 3, "body": "c2", "rev": 3, **live}]


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


@pytest.mark.parametrize("engine_name", ["delta-rs", "delta-spark"])
def test_deletion_vectors_mark_the_changed_rows_of_a_new_table(engine_name, tmp_path, request):
    """`deletion_vectors: true` creates the table with them on; the second batch's MERGE (delta-rs through
    the small commits, delta-spark its own) marks the changed rows deleted; both readers see the rows."""
    uri = str(tmp_path / "t")
    shape = TableShape(deletion_vectors=True)
    spark = request.getfixturevalue("spark") if engine_name == "delta-spark" else None
    sink = MergeSink(open_table(engine_name, uri, None, spark, shape.table_properties()), ("id",), shape=shape)
    sink.apply_typed(_typed([(ChangeKind.INSERT, {"id": i, "body": f"b{i}", "rev": 1}, T0, None)
                             for i in range(10)]), APP, 0)
    sink.apply_typed(_typed([(ChangeKind.UPDATE_AFTER, {"id": 1, "body": "new", "rev": 2}, T1, None),
                             (ChangeKind.DELETE, {"id": 4}, T1, None)], 10), APP, 1)
    table = DeltaTable(uri)
    assert "deletionVectors" in table.protocol().reader_features
    assert table.metadata().configuration["delta.enableDeletionVectors"] == "true"
    assert any("deletionVector" in entry.read_text() for entry in (tmp_path / "t" / "_delta_log").glob("*.json"))
    expected = [{"id": i, "body": "new" if i == 1 else f"b{i}", "rev": 2 if i == 1 else 1} for i in range(10) if i != 4]
    assert sorted(scan(table).read_all().to_pylist(), key=lambda r: r["id"]) == expected
    if spark is not None:
        assert sorted(spark.read.format("delta").load(uri).toArrow().to_pylist(), key=lambda r: r["id"]) == expected


def test_deletion_vectors_are_never_turned_on_silently(tmp_path):
    """A table created without them stops a pipeline that asks for them, saying how to enable them."""
    uri = str(tmp_path / "t")
    MergeSink(DeltaRsTable(uri), ("id",)).apply_typed(
        _typed([(ChangeKind.INSERT, {"id": 1, "body": "a", "rev": 1}, T0, None)]), APP, 0)
    shape = TableShape(deletion_vectors=True)
    sink = MergeSink(DeltaRsTable(uri, properties=shape.table_properties()), ("id",), shape=shape)
    with pytest.raises(DeltaSchemaError, match=r"t: table_shape.deletion_vectors is set .* SET TBLPROPERTIES "
                                               r"\('delta.enableDeletionVectors' = true\)"):
        sink.apply_typed(_typed([(ChangeKind.INSERT, {"id": 2, "body": "b", "rev": 1}, T1, None)], 1), APP, 1)
    assert DeltaTable(uri).version() == 1
