"""A delta-rs table handle reads the Delta log at most once per micro-batch commit (`last_batch`, then
the schema and the MERGE as it left them; with small commits, none while their snapshot is current),
and still sees what another writer committed before the batch."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from connectors.delta.delta_rs import DeltaRsTable
from service.kafka_to_delta.sink.merge_sink import MergeSink
from vocabulary.changes import ChangeKind

APP = "cdc-lakehouse/db/t/q"


def _net(ids: list[int], name: str) -> pa.Table:
    return pa.table({
        "key": [json.dumps([i]) for i in ids],
        "kind": [ChangeKind.UPDATE_AFTER.value] * len(ids),
        "row": [json.dumps({"id": i, "name": f"{name}{i}"}) for i in ids],
        "types": [json.dumps({"id": "int64", "name": "string"})] * len(ids),
    })


@pytest.mark.parametrize("small_commits", [True, False])
def test_one_log_refresh_per_batch_and_another_writers_commit_is_seen(tmp_path, monkeypatch, small_commits):
    uri = str(tmp_path / "t")
    sink = MergeSink(DeltaRsTable(uri, small_commits=small_commits), ("id",), one_commit_create=True)
    sink.apply(_net([1, 2], "a"), APP, 0)
    sink.apply(_net([1], "a"), APP, 1)  # the handle is open from here on
    refreshes: list[int] = []
    original = DeltaTable.update_incremental

    def counted(self: DeltaTable) -> None:
        refreshes.append(1)
        original(self)

    monkeypatch.setattr(DeltaTable, "update_incremental", counted)
    sink.apply(_net([2, 3], "b"), APP, 2)
    # MERGE: the replay check's; the schema and the MERGE read the handle as it is. Small commits: the
    # snapshot their last commit left answers all three
    assert len(refreshes) == (0 if small_commits else 1)

    # another writer commits between two batches: the next batch's check reads it, the MERGE applies on it
    write_deltalake(uri, pa.table({"id": pa.array([9], pa.int64()), "name": ["other"]}), mode="append")
    refreshes.clear()
    sink.apply(_net([3, 4], "c"), APP, 3)
    assert len(refreshes) == 1
    rows = sorted(DeltaTable(uri).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert rows == [{"id": 1, "name": "a1"}, {"id": 2, "name": "b2"}, {"id": 3, "name": "c3"},
                    {"id": 4, "name": "c4"}, {"id": 9, "name": "other"}]
    assert DeltaTable(uri).transaction_version(APP) == 3
    assert sink.already_committed(APP, 3)  # a replay of the batch is still recognised


def test_reads_outside_a_batch_refresh_every_time(tmp_path):
    uri = str(tmp_path / "t")
    table = DeltaRsTable(uri)
    write_deltalake(uri, pa.table({"id": pa.array([1], pa.int64())}))
    assert table.last_batch(APP) is None
    assert table.version() == 0
    write_deltalake(uri, pa.table({"id": pa.array([2], pa.int64()), "x": ["y"]}), mode="append", schema_mode="merge")
    assert table.version() == 1  # a read other than the batch's schema/MERGE refreshes
    assert table.schema().names == ["id", "x"]  # and the schema after it is the new one
