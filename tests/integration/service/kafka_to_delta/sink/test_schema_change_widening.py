"""A source column altered int -> bigint, then a value above 2^31: on both Delta engines, `evolve` and
`lenient` widen the table's column before the batch's MERGE (replay-safe), `fail` stops naming the column.
The tables are read back with the engine's own Delta reader (delta-spark: Spark; delta-rs: delta-rs)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from connectors.delta.delta_rs import DeltaRsTable, DeltaSchemaError
from service.kafka_to_delta.sink.merge_sink import MergeSink
from vocabulary.changes import ChangeKind

APP = "cdc-lakehouse/test/widening"
BIG = 2**31 + 5
INT_TYPES = {"id": "int32", "v": "int32", "amount": "decimal(8,2)"}
WIDE_TYPES = {"id": "int32", "v": "int64", "amount": "decimal(12,2)"}


def _net(*rows: tuple[dict, dict]) -> pa.Table:
    """Net upserts as the pipeline hands them over: key, kind, row (JSON), types (JSON)."""
    return pa.table({
        "key": [json.dumps([row["id"]]) for row, _ in rows],
        "kind": [ChangeKind.UPDATE_AFTER.value] * len(rows),
        "row": [json.dumps(row) for row, _ in rows],
        "types": [json.dumps(types) for _, types in rows],
    })


def _amount(text: str) -> str:
    """A decimal as the Connect JSON converter sends it: the unscaled value, big-endian, base64."""
    import base64
    from decimal import Decimal

    unscaled = int(Decimal(text).scaleb(2))
    return base64.b64encode(unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)).decode()



def _sorted(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda row: row["id"])


@pytest.mark.parametrize("policy", ["evolve", "lenient"])
def test_a_value_above_int32_widens_the_column(engine, policy, tmp_path):
    open_engine, read = engine
    uri = str(tmp_path / "t")
    table = open_engine(uri)
    sink = MergeSink(table, ("id",), schema_changes=policy)
    sink.apply(_net(({"id": 1, "v": 7, "amount": _amount("12.50")}, INT_TYPES)), APP, 0)
    assert table.schema().field("v").type == pa.int32()

    batch = _net(({"id": 2, "v": BIG, "amount": _amount("1234567890.12")}, WIDE_TYPES),
                 ({"id": 1, "v": 8, "amount": _amount("1.00")}, WIDE_TYPES))
    outcome = sink.apply(batch, APP, 1)
    assert (outcome.upserts, outcome.skipped_replay) == (2, False)
    schema = table.schema()
    assert schema.field("v").type == pa.int64() and schema.field("amount").type == pa.decimal128(12, 2)
    read_back = read(uri)
    assert read_back.schema.field("v").type == pa.int64()
    assert [(row["id"], row["v"], str(row["amount"])) for row in _sorted(read_back)] == [
        (1, 8, "1.00"), (2, BIG, "1234567890.12")]
    assert _sorted(DeltaTable(uri).to_pyarrow_table()) == _sorted(read_back)  # delta-rs reads either engine's table
    assert DeltaTable(uri).metadata().configuration.get("delta.enableChangeDataFeed") == "true"

    version = table.version()
    assert sink.apply(batch, APP, 1).skipped_replay  # a replay after the MERGE: nothing
    table.widen({"v": pa.int64(), "amount": pa.decimal128(12, 2)}, APP, 1)  # a widening repeated: nothing
    assert table.version() == version and table.last_batch(APP) == 1


def test_a_replay_after_the_widening_but_before_the_merge_merges_once(engine, tmp_path):
    open_engine, read = engine
    uri = str(tmp_path / "t")
    table = open_engine(uri)
    sink = MergeSink(table, ("id",), schema_changes="evolve")
    sink.apply(_net(({"id": 1, "v": 7, "amount": _amount("1.00")}, INT_TYPES)), APP, 0)
    table.widen({"v": pa.int64()}, APP, 1)  # the process died after this commit
    assert table.last_batch(APP) == 0
    version = table.version()
    outcome = sink.apply(_net(({"id": 2, "v": BIG, "amount": _amount("2.00")}, {**INT_TYPES, "v": "int64"})), APP, 1)
    assert not outcome.skipped_replay and table.version() == version + 1  # no second widening, one MERGE
    assert [(row["id"], row["v"]) for row in _sorted(read(uri))] == [(1, 7), (2, BIG)]


def test_fail_stops_naming_the_column(engine, tmp_path):
    open_engine, read = engine
    uri = str(tmp_path / "t")
    table = open_engine(uri)
    sink = MergeSink(table, ("id",), schema_changes="fail")
    sink.apply(_net(({"id": 1, "v": 7, "amount": _amount("1.00")}, INT_TYPES)), APP, 0)
    with pytest.raises(DeltaSchemaError, match=r"column 'v' has type int64 in this batch but int32 in the table"):
        sink.apply(_net(({"id": 2, "v": BIG, "amount": _amount("2.00")}, {**INT_TYPES, "v": "int64"})), APP, 1)
    assert table.last_batch(APP) == 0 and table.schema().field("v").type == pa.int32()
    assert [row["id"] for row in _sorted(read(uri))] == [1]


def _envelope(row: dict, qty_type: str, precision: int) -> dict:
    """A Debezium envelope (JSON with its schema block) of `items (id int, qty, amount numeric(precision,2))`."""
    fields = [{"field": "id", "type": "int32"}, {"field": "qty", "type": qty_type, "optional": True},
              {"field": "amount", "type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
               "parameters": {"scale": "2", "connect.decimal.precision": str(precision)}}]
    image = {"type": "struct", "optional": True, "fields": fields}
    schema = {"type": "struct", "fields": [{**image, "field": "before"}, {**image, "field": "after"},
                                           {"field": "op", "type": "string"}]}
    return {"schema": schema, "payload": {"op": "c", "before": None, "after": row}}


def test_records_from_before_and_after_the_change_in_one_batch(tmp_path):
    from tests.integration.service.kafka_to_delta.sink.test_merge_sink import _typed

    uri = str(tmp_path / "t")
    sink = MergeSink(DeltaRsTable(uri), ("id",))
    sink.apply_typed(_typed([(1, _envelope({"id": 1, "qty": 5, "amount": _amount("1.50")}, "int32", 8))], 0), APP, 0)
    before = _envelope({"id": 2, "qty": 6, "amount": _amount("2.50")}, "int32", 8)
    after = _envelope({"id": 3, "qty": BIG, "amount": _amount("1234567890.12")}, "int64", 12)
    sink.apply_typed(_typed([(2, before), (3, after)], 1), APP, 1)
    read_back = DeltaTable(uri).to_pyarrow_table()
    assert read_back.schema.field("qty").type == pa.int64()
    assert read_back.schema.field("amount").type == pa.decimal128(12, 2)
    assert [(row["id"], row["qty"], str(row["amount"])) for row in _sorted(read_back)] == [
        (1, 5, "1.50"), (2, 6, "2.50"), (3, BIG, "1234567890.12")]


def test_ignore_keeps_the_tables_schema(tmp_path):
    uri = str(tmp_path / "t")
    sink = MergeSink(DeltaRsTable(uri), ("id",), schema_changes="ignore")
    sink.apply(_net(({"id": 1, "v": 7, "amount": _amount("1.00")}, INT_TYPES)), APP, 0)
    added = {**WIDE_TYPES, "note": "string"}
    sink.apply(_net(({"id": 2, "v": 8, "amount": _amount("2.00"), "note": "n"}, added)), APP, 1)
    read_back = DeltaTable(uri).to_pyarrow_table()
    assert read_back.schema.names == ["id", "v", "amount"] and read_back.schema.field("v").type == pa.int32()
    assert [(row["id"], row["v"]) for row in _sorted(read_back)] == [(1, 7), (2, 8)]
    with pytest.raises(DeltaSchemaError, match=r"column 'v' has type int64 in this batch but int32 in the table"):
        sink.apply(_net(({"id": 3, "v": BIG, "amount": _amount("3.00")}, WIDE_TYPES)), APP, 2)
