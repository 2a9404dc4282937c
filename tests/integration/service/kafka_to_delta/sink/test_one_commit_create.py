"""A database source's new table is created holding its first batch in one commit: on both Delta
engines it reads back as a create-then-MERGE would leave it (deletes absent, a kept column NULL),
carries the batch's application transaction (a replay is skipped), and later batches MERGE as usual."""

from __future__ import annotations

import json

import pyarrow as pa

from connectors.delta.delta_rs import DeltaRsTable
from service.kafka_to_delta.sink.merge_sink import MergeSink
from vocabulary.changes import ChangeKind

APP = "cdc-lakehouse/db/t/q"


def _net(rows: list[tuple[str, dict]], unchanged: dict[int, list[str]] | None = None) -> pa.Table:
    unchanged = unchanged or {}
    return pa.table({
        "key": [json.dumps([row["id"]]) for _, row in rows],
        "kind": [kind for kind, _ in rows],
        "row": [json.dumps(row) for _, row in rows],
        "types": [json.dumps({"id": "int64", "name": "string", "note": "string"})] * len(rows),
        "unchanged": [json.dumps(unchanged[row["id"]]) if row["id"] in unchanged else None for _, row in rows],
    })



def test_first_batch_creates_the_table_in_one_commit_then_merges(engine, tmp_path):
    open_engine, read = engine
    uri = str(tmp_path / "t")
    table = open_engine(uri)
    sink = MergeSink(table, ("id",), one_commit_create=True)
    upsert, delete = ChangeKind.UPDATE_AFTER.value, ChangeKind.DELETE.value
    first = _net([(upsert, {"id": 1, "name": "a", "note": "x"}), (delete, {"id": 2, "name": "b", "note": "y"}),
                  (upsert, {"id": 3, "name": "c", "note": None})], unchanged={3: ["note"]})
    sink.apply(first, APP, 0)
    rows = sorted(read(uri).to_pylist(), key=lambda r: r["id"])
    assert rows == [{"id": 1, "name": "a", "note": "x"}, {"id": 3, "name": "c", "note": None}]
    assert table.last_batch(APP) == 0
    if isinstance(table, DeltaRsTable):
        assert table.version() == 0  # one commit: no empty first version
    assert sink.apply(first, APP, 0).skipped_replay
    sink.apply(_net([(upsert, {"id": 1, "name": "a2", "note": "x2"}), (delete, {"id": 3, "name": "c", "note": None})]),
               APP, 1)
    assert read(uri).to_pylist() == [{"id": 1, "name": "a2", "note": "x2"}]
    assert table.last_batch(APP) == 1
