"""MergeSink against a real Delta table (delta-rs, read back with a Delta reader); no Spark."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from connectors.delta.delta_rs import DeltaRsTable, DeltaSchemaError
from connectors.kafka.range_reader import SOURCE_SCHEMA
from service.config.settings import PipelineSettings
from service.kafka_to_delta.sink.merge_sink import MergeSink
from service.kafka_to_delta.source.batch_changes import batch_changes
from service.kafka_to_delta.source.decode_stage import batch_decoder
from service.kafka_to_delta.source.partition_changes import PartitionReducer
from vocabulary.changes import ChangeKind

APP = "cdc-lakehouse/test"


def _net(*changes: tuple[ChangeKind, dict, dict | None]) -> pa.Table:
    """Net-change rows as the pipeline hands them over: key, kind, row (JSON), types (JSON)."""
    return pa.table({
        "key": [json.dumps([row["id"]]) for _, row, _ in changes],
        "kind": [kind.value for kind, _, _ in changes],
        "row": [json.dumps(row) for _, row, _ in changes],
        "types": [json.dumps(types) if types else None for _, _, types in changes],
    })


def _rows(uri) -> list[dict]:
    return sorted(DeltaTable(str(uri)).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])


def test_create_upsert_delete_evolve_and_skip_replays(tmp_path):
    uri = tmp_path / "t"
    sink = MergeSink(DeltaRsTable(str(uri)), ("id",))
    types = {"id": "int32", "name": "string"}
    first = sink.apply(_net((ChangeKind.INSERT, {"id": 1, "name": "a"}, types),
                            (ChangeKind.INSERT, {"id": 2, "name": "b"}, types)), APP, 0)
    assert (first.upserts, first.deletes) == (2, 0)
    assert DeltaTable(str(uri)).schema().fields[0].type.type == "integer"  # from the schema block
    assert DeltaTable(str(uri)).metadata().configuration["delta.enableChangeDataFeed"] == "true"
    sink.apply(_net((ChangeKind.UPDATE_AFTER, {"id": 1, "name": "a2", "email": "x@y"}, None),
                    (ChangeKind.DELETE, {"id": 2}, None)), APP, 1)
    assert _rows(uri) == [{"id": 1, "name": "a2", "email": "x@y"}]
    version = DeltaTable(str(uri)).version()
    replay = sink.apply(_net((ChangeKind.DELETE, {"id": 1}, None)), APP, 1)
    assert replay.skipped_replay and DeltaTable(str(uri)).version() == version
    assert sink.apply(_net(), APP, 2).upserts == 0 and DeltaTable(str(uri)).version() == version
    assert DeltaRsTable(str(uri)).last_batch(APP) == 1


def test_a_value_that_does_not_fit_the_column_is_a_clear_error(tmp_path):
    uri = tmp_path / "t"
    sink = MergeSink(DeltaRsTable(str(uri)), ("id",))
    sink.apply(_net((ChangeKind.INSERT, {"id": 1, "n": 5}, None)), APP, 0)
    with pytest.raises(DeltaSchemaError, match=r"column 'n'"):
        sink.apply(_net((ChangeKind.INSERT, {"id": 2, "n": "not a number"}, None)), APP, 1)
    assert _rows(uri) == [{"id": 1, "n": 5}]


def _typed(pairs: list[tuple[int, dict]], first_offset: int) -> pa.Table:
    """Typed net changes of Debezium envelopes (value, with or without a schema block) read at
    partition 0 from `first_offset`, as the plain path hands them to the sink."""
    settings = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"])
    n = len(pairs)
    records = pa.RecordBatch.from_pydict({
        "key": [json.dumps({"id": k}).encode() for k, _ in pairs], "value": [json.dumps(v).encode() for _, v in pairs],
        "topic": ["t"] * n, "partition": pa.array([0] * n, pa.int32()),
        "offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
        "timestamp": pa.array([1_700_000_000_000_000] * n, pa.timestamp("us", tz="UTC")),
        "headers": pa.nulls(n, SOURCE_SCHEMA.field("headers").type), "watermark_floor": pa.nulls(n, pa.int64()),
    }, schema=SOURCE_SCHEMA)
    payloads = pa.Table.from_batches(list(PartitionReducer(batch_decoder(settings), ("id",))(lambda: iter([records]))))
    return batch_changes(payloads).changes


def test_a_value_that_does_not_fit_the_tables_column_names_its_record(tmp_path):
    uri = tmp_path / "t"
    sink = MergeSink(DeltaRsTable(str(uri)), ("id",), schema_changes="ignore")  # lenient would widen the column
    fields = [{"field": "id", "type": "int32"}, {"field": "n", "type": "int32", "optional": True}]
    image = {"type": "struct", "optional": True, "fields": fields}
    schema = {"type": "struct", "fields": [{**image, "field": "before"}, {**image, "field": "after"},
                                           {"field": "op", "type": "string"}]}
    declared = {"schema": schema, "payload": {"op": "c", "before": None, "after": {"id": 1, "n": 5}}}
    sink.apply_typed(_typed([(1, declared)], 0), APP, 0)
    bare = {"op": "c", "before": None, "after": {"id": 2, "n": 2**40}}  # no schema block: typed int64 here
    with pytest.raises(DeltaSchemaError, match=r"column 'n' .* int32 in the table \(first at topic=t partition=0 "
                                               r"offset=7 key=") as caught:
        sink.apply_typed(_typed([(3, {**bare, "after": {"id": 3, "n": 1}}), (2, bare)], 6), APP, 1)
    assert str(2**40) not in str(caught.value)
    assert _rows(uri) == [{"id": 1, "n": 5}]


def test_missing_primary_key_column_is_refused(tmp_path):
    sink = MergeSink(DeltaRsTable(str(tmp_path / "t")), ("tenant", "id"))
    with pytest.raises(DeltaSchemaError, match=r"\['tenant'\]"):
        sink.apply(_net((ChangeKind.INSERT, {"id": 1}, None)), APP, 0)


def test_unchanged_toast_column_keeps_the_stored_value(tmp_path):
    uri = tmp_path / "t"
    sink = MergeSink(DeltaRsTable(str(uri)), ("id",))
    types = {"id": "int32", "body": "string", "rev": "int32"}
    sink.apply(_net((ChangeKind.INSERT, {"id": 1, "body": "large text", "rev": 1}, types),
                    (ChangeKind.INSERT, {"id": 2, "body": "other", "rev": 1}, types)), APP, 0)
    net = _net((ChangeKind.UPDATE_AFTER, {"id": 1, "rev": 2}, types),
               (ChangeKind.UPDATE_AFTER, {"id": 2, "body": "new", "rev": 2}, types))
    net = net.append_column("unchanged", pa.array([json.dumps(["body"]), None]))
    sink.apply(net, APP, 1)
    assert _rows(uri) == [{"id": 1, "body": "large text", "rev": 2}, {"id": 2, "body": "new", "rev": 2}]


def test_truncate_empties_the_table_in_the_same_commit_as_the_later_changes(tmp_path):
    uri = tmp_path / "t"
    sink = MergeSink(DeltaRsTable(str(uri)), ("id",))
    types = {"id": "int32", "name": "string"}
    sink.apply(_net(*[(ChangeKind.INSERT, {"id": i, "name": "x"}, types) for i in range(5)]), APP, 0)
    before = DeltaTable(str(uri)).version()
    outcome = sink.apply(_net((ChangeKind.INSERT, {"id": 9, "name": "after"}, types)), APP, 1, truncate=True)
    assert outcome.truncated and DeltaTable(str(uri)).version() == before + 1
    assert _rows(uri) == [{"id": 9, "name": "after"}]
    empty = _net((ChangeKind.INSERT, {"id": 1, "name": "y"}, types)).slice(0, 0)
    sink.apply(empty, APP, 2, truncate=True)
    assert _rows(uri) == [] and DeltaTable(str(uri)).transaction_version(APP) == 2
