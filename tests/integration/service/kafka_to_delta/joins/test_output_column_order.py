"""A join's table takes the documented column order (left or probe columns, then right or build columns)
when only its right or build input declares types (a Connect schema block), on both Delta engines."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from connectors.delta.delta_rs import DeltaRsTable
from service.kafka_to_delta.joins.enrichment_rows import enrich
from service.kafka_to_delta.sink.merge_sink import MergeSink
from tests.unit.service.kafka_to_delta.joins.test_enrichment_rows import PROBE, _probes
from tests.unit.service.kafka_to_delta.joins.test_regular_join_rules import (
    COLUMNS,
    Run,
    customer,
    order,
    rules,
)

APP = "cdc-lakehouse/j/out/query"
CUSTOMER_TYPES = json.dumps({"customer_id": "int32", "name": "string"})


def _read_back(uri: str, spark) -> list[tuple[list[str], list[tuple]]]:
    """The table's columns and rows, with delta-rs's reader and with Spark's (delta-spark)."""
    by_rs = DeltaTable(uri).to_pyarrow_table()
    by_spark = spark.read.format("delta").load(uri).toArrow()
    return [(t.column_names, sorted(tuple(r.values()) for r in t.to_pylist())) for t in (by_rs, by_spark)]


@pytest.mark.parametrize("left_join", [False, True], ids=["inner", "left"])
def test_a_regular_join_whose_right_input_alone_declares_types_keeps_left_columns_first(
        tmp_path, spark, left_join):
    run = Run(rules(outer=left_join))
    right = run.change("c", "+I", 7, customer(7, "ann"), 0)
    right["types"] = CUSTOMER_TYPES
    left = [run.change("o", "+I", 1, order(1, 7), 0), run.change("o", "+I", 2, order(2, 9), 0)]
    step_output = run.batch(left, [right])
    uri = str(tmp_path / "orders_customers")
    MergeSink(DeltaRsTable(uri), ("order_id",)).apply(step_output, APP, 0)
    expected_rows = [(1, 7, 10, 7, "ann")] + ([(2, 9, 10, None, None)] if left_join else [])
    for columns, rows in _read_back(uri, spark):
        assert columns == list(COLUMNS)
        assert rows == expected_rows
    assert DeltaTable(uri).to_pyarrow_table().schema.field("customer_id0").type == pa.int32()


def test_an_enrichment_join_whose_build_input_alone_declares_types_keeps_probe_columns_first(tmp_path, spark):
    probes = _probes((10, {"order_id": 10, "customer_id": 1, "item": "pen"}),
                     (11, {"order_id": 11, "customer_id": 9, "item": "ink"}))
    build = {"[1]": (json.dumps({"id": 1, "name": "Ann"}), json.dumps({"id": "int16", "name": "string"}))}
    enriched = enrich(probes, build, PROBE.join_key, ("order_id",), emit_missing=True)
    uri = str(tmp_path / "orders_enriched")
    MergeSink(DeltaRsTable(uri), ("order_id",)).apply(enriched.net, APP, 0)
    for columns, rows in _read_back(uri, spark):
        assert columns == ["order_id", "customer_id", "item", "id", "name"]
        assert rows == [(10, 1, "pen", 1, "Ann"), (11, 9, "ink", None, None)]
