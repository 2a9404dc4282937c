"""Small commits on a table with deletion vectors enabled mark changed rows deleted instead of rewriting
their files, and equal delta-rs's MERGE on a table without them (rows, change feed, transactions), batch
after batch; delta-spark and delta-rs read the table and its feed back; vectors other writers made
(delta-spark's DELETE, delta-rs's checkpoint) are honoured; a log this module cannot follow leaves the
batch to the MERGE."""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake

from connectors.delta import data_file_rows, log_replay
from connectors.delta import small_commit as small
from connectors.delta.deletion_vectors import (
    Descriptor,
    positions,
    vector_file,
    write_vectors,
    z85_decode,
    z85_encode,
)
from connectors.delta.delta_rs import CDF_ENABLED, DeltaRsTable
from connectors.delta.merge_plan import DELETE_FLAG
from tests.integration.connectors.delta.test_small_commit import (
    APP,
    SCHEMA,
    SEEDS,
    SMALL,
    _batch,
    _engines,
    _feed,
    _naive,
    _values,
    merge_both,
    spark_reads_as,
)

VECTORS = {**CDF_ENABLED, "delta.enableDeletionVectors": "true"}


def _start(path: Path, rng: random.Random, configuration: dict[str, str]) -> None:
    for first in range(0, rng.choice([20, 60, 120]), 20):
        write_deltalake(str(path), pa.table(_values(rng, list(range(first, first + 20))), schema=SCHEMA),
                        mode="append", configuration=configuration)


def _rows(path: Path) -> list[dict]:
    """The table's rows read by delta-rs's query engine (its pyarrow dataset refuses deletion vectors)."""
    table = DeltaTable(str(path))
    found = pa.table(QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all())
    return sorted(found.cast(pa.schema([found.schema.field(n).with_type(SCHEMA.field(n).type)
                                        if n in SCHEMA.names else found.schema.field(n) for n in found.schema.names]))
                  .to_pylist(), key=lambda row: row["id"])


def _marked_table(path: Path, seed: int, batches: int, universe: int) -> DeltaRsTable:
    """A table with deletion vectors after `batches` generated batches of small commits."""
    rng = random.Random(seed)
    _start(path, rng, VECTORS)
    table = DeltaRsTable(str(path))
    for batch_id in range(batches):
        table.merge(_batch(rng, universe), ("id",), APP, batch_id)
    return table


def _vectors(path: Path) -> list[dict]:
    """Every deletion vector any log entry names."""
    found = []
    for entry in sorted((path / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "add" in action and action["add"].get("deletionVector"):
                found.append(action["add"]["deletionVector"])
    return found


@pytest.mark.parametrize("seed", SEEDS)
def test_marked_rows_equal_the_merge(tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    if seed % 2:
        monkeypatch.setattr(data_file_rows, "KEPT_ROWS_BYTES", 0)
    rng = random.Random(seed)
    fast, reference = tmp_path / "fast", tmp_path / "reference"
    _start(fast, random.Random(seed), VECTORS)
    _start(reference, random.Random(seed), CDF_ENABLED)
    start = DeltaTable(str(fast)).version()
    merge_both(fast, reference, rng, 12, 160, _rows)
    assert _feed(fast, start + 1) == _feed(reference, start + 1), f"seed {seed}"
    assert DeltaTable(str(fast)).transaction_version(APP) == DeltaTable(str(reference)).transaction_version(APP)
    assert _engines(DeltaTable(str(fast))).count(SMALL) >= 9
    assert _vectors(fast), f"seed {seed}: no row was marked deleted"
    for file in log_replay.live_files(str(fast), DeltaTable(str(fast)).version()).values():
        if file.deletion_vector is not None:  # a file most of whose rows are gone was rewritten instead
            assert file.deletion_vector.cardinality * 2 <= json.loads(file.stats)["numRecords"], f"seed {seed}"
    before = len(list(fast.glob("*.parquet")))
    assert DeltaRsTable(str(fast)).compact()[0] > 1  # OPTIMIZE honours the vectors
    assert len(list(fast.glob("*.parquet"))) > before and _rows(fast) == _rows(reference), f"seed {seed}"


def test_delta_spark_reads_marked_rows(tmp_path: Path, spark) -> None:  # noqa: ANN001 - the run's session
    path = tmp_path / "t"
    _marked_table(path, 11, 5, 100)
    assert _vectors(path)
    spark_reads_as(spark, path, _rows)


def test_vectors_of_other_writers_and_checkpoints_are_honoured(tmp_path: Path, spark) -> None:  # noqa: ANN001
    """delta-spark marks rows deleted (its own vector files); the small commits continue from a log whose
    newest state is in a checkpoint; the table equals delta-rs's MERGE on a copy of the same start."""
    path, copy = tmp_path / "t", tmp_path / "copy"
    rng = random.Random(5)
    _start(path, rng, VECTORS)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 7 = 0")
    spark.sql(f"UPDATE delta.`{path}` SET name = 'spark' WHERE id % 5 = 1")
    assert _vectors(path), "delta-spark wrote no deletion vector"
    DeltaTable(str(path)).create_checkpoint()
    shutil.copytree(path, copy)
    merge_both(path, copy, rng, 6, 140, _rows)
    assert _engines(DeltaTable(str(path))).count(SMALL) >= 4
    rows = [row.asDict(recursive=True) for row in spark.read.format("delta").load(str(path)).collect()]
    assert sorted(rows, key=lambda row: row["id"]) == [_naive(row) for row in _rows(path)]


def test_a_log_it_cannot_follow_goes_to_the_merge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"id": [1, 2], "v": ["a", "b"]}), configuration=VECTORS)
    commits = small.SmallCommits(str(path))
    assert commits.load(DeltaTable(str(path))).merge_on_read
    monkeypatch.setattr(small, "live_files", lambda root, version: {})
    assert not commits.load(DeltaTable(str(path))).fits
    assert not commits.commit(pa.table({"id": [1], "v": ["c"], DELETE_FLAG: [False]}), ("id",), APP, 0)
    monkeypatch.undo()
    assert commits.load(DeltaTable(str(path))).fits
    assert commits.commit(pa.table({"id": [1], "v": ["c"], DELETE_FLAG: [False]}), ("id",), APP, 0)
    assert _vectors(path) and len(list(path.glob("*.parquet"))) == 2  # marked, not rewritten


def test_a_file_whose_rows_all_go_is_removed(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"id": [1, 2], "v": ["a", "b"]}), configuration=VECTORS)
    table = DeltaRsTable(str(path))
    table.merge(pa.table({"id": [1], "v": ["A"], DELETE_FLAG: [False]}), ("id",), APP, 0)
    table.merge(pa.table({"id": [2], "v": [None], DELETE_FLAG: [True]}), ("id",), APP, 1)
    assert _engines(DeltaTable(str(path)))[:2] == [SMALL, SMALL]
    live = log_replay.live_files(str(path), DeltaTable(str(path)).version())
    assert len(live) == 1 and next(iter(live.values())).deletion_vector is None  # the first file is gone
    found = pa.table(QueryBuilder().register("t", DeltaTable(str(path))).execute("SELECT * FROM t").read_all())
    assert found.to_pylist() == [{"id": 1, "v": "A"}]


def test_vectors_round_trip(tmp_path: Path) -> None:
    data = bytes(range(256)) * 4
    assert z85_decode(z85_encode(data)) == data
    assert z85_encode(bytes.fromhex("864FD26FB559F75B")) == "HelloWorld"  # the Z85 specification's example
    rng = np.random.default_rng(3)
    vectors = [np.array([], np.int64), np.array([0], np.int64), np.array([5, (1 << 32) + 7, (3 << 32)], np.int64),
               np.unique(rng.integers(0, 1 << 20, 50_000))]
    name, descriptors = write_vectors(str(tmp_path), vectors)
    assert (tmp_path / name).exists()
    for rows, descriptor in zip(vectors, descriptors):
        again = Descriptor.of(json.loads(json.dumps(descriptor.action())))
        assert descriptor.cardinality == len(rows)
        assert np.array_equal(positions(str(tmp_path), again), rows)


@pytest.mark.parametrize("seed", SEEDS)
def test_rows_found_reading_only_their_row_groups(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    count = int(rng.integers(1, 400))
    rows = pa.table({"id": pa.array(np.arange(count), pa.int64()), "v": [f"v{i}" for i in range(count)]})
    pq.write_table(rows, tmp_path / "f.parquet", row_group_size=int(rng.integers(1, 60)))
    wanted = np.unique(rng.integers(0, count, int(rng.integers(1, count + 1))))
    found = data_file_rows.file_rows(str(tmp_path), data_file_rows.DataFile("f.parquet", 0, {}), rows.schema, wanted)
    assert found.equals(rows.take(pa.array(wanted))), f"seed {seed}"


@pytest.mark.parametrize("vectors", [True, False])
@pytest.mark.parametrize("kept", [True, False])
def test_a_file_older_than_an_added_column_is_read_marking_rows(tmp_path: Path, kept: bool, vectors: bool,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch with a new column goes to the MERGE (schema evolution), which rewrites only the file it
    touches; the next small commit marks a row of the other file (without vectors: rewrites it), written
    without that column by a small commit (its rows kept in memory in their schema, or read back)."""
    if not kept:
        monkeypatch.setattr(data_file_rows, "KEPT_ROWS_BYTES", 0)
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"tenant": ["a"] * 10, "id": list(range(10)),
                                         "v": [f"a{i}" for i in range(10)]}),
                   configuration=VECTORS if vectors else CDF_ENABLED)
    table = DeltaRsTable(str(path))
    table.merge(pa.table({"tenant": ["b"] * 10, "id": list(range(10)), "v": [f"b{i}" for i in range(10)],
                          DELETE_FLAG: [False] * 10}), ("tenant", "id"), APP, 0)
    table.merge(pa.table({"tenant": ["a"], "id": [2], "v": ["w"], "extra": [7], DELETE_FLAG: [False]}),
                ("tenant", "id"), APP, 1)
    table.merge(pa.table({"tenant": ["b", "a"], "id": [5, 3], "v": ["B5", "A3"], DELETE_FLAG: [False, False]}),
                ("tenant", "id"), APP, 2)
    assert _engines(DeltaTable(str(path)))[:3] == [SMALL, "delta-rs:py-1.6.6", SMALL]
    assert bool(_vectors(path)) == vectors
    found = {(r["tenant"], r["id"]): (r["v"], r["extra"])
             for r in pa.table(QueryBuilder().register("t", DeltaTable(str(path))).execute("SELECT * FROM t")
                               .read_all()).to_pylist()}
    assert len(found) == 20
    assert found[("b", 5)] == ("B5", None) and found[("a", 3)] == ("A3", None) and found[("a", 2)] == ("w", 7)
    assert found[("b", 4)] == ("b4", None)


def test_vacuum_deletes_the_vector_files_no_reader_needs(tmp_path: Path) -> None:
    """delta-rs's VACUUM leaves vector files in place; the table's VACUUM deletes those neither a live file
    nor a file removed within the retention names, once older than the retention."""
    path = tmp_path / "t"
    table = _marked_table(path, 8, 8, 120)
    live = {vector_file(str(path), file.deletion_vector)
            for file in log_replay.live_files(str(path), DeltaTable(str(path)).version()).values()
            if file.deletion_vector is not None}
    written = {str(p) for p in path.glob("deletion_vector_*.bin")}
    assert live and written - live, "some vector was replaced by a later one"
    rows = _rows(path)
    table.vacuum(1)  # every vector file is younger than an hour
    assert {str(p) for p in path.glob("deletion_vector_*.bin")} == written
    two_hours_ago = time.time() - 7200
    for name in written:
        os.utime(name, (two_hours_ago, two_hours_ago))
    table.vacuum(1)  # old files, but each replaced vector's file was removed within the hour: still needed
    assert {str(p) for p in path.glob("deletion_vector_*.bin")} == written
    table.vacuum(0)
    assert {str(p) for p in path.glob("deletion_vector_*.bin")} == live
    assert _rows(path) == rows
