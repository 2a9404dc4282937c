"""The small commit (fast path) equals delta-rs's MERGE (reference): same rows, same change feed, same
application transactions, batch after batch over generated tables and batches; what does not fit goes
to the MERGE; a lost race gives way; delta-spark reads a small commit's table and change feed."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import random
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from connectors.delta import data_file_rows
from connectors.delta import small_commit as small
from connectors.delta.delta_rs import CDF_ENABLED, DeltaRsTable
from connectors.delta.merge_plan import DELETE_FLAG, keep_flag
from tests.support.run_seed import run_seed

SEEDS = [0, 1, 2, 3, 4, run_seed(1 << 30)]
APP = "app-small"
SMALL = "cdc-lakehouse small commit"
SCHEMA = pa.schema([
    ("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64()), ("note", pa.string()),
    ("day", pa.date32()), ("at", pa.timestamp("us", tz="UTC")), ("price", pa.decimal128(12, 2)),
    ("tags", pa.list_(pa.string())),
])


def _values(rng: random.Random, ids: list[int]) -> dict[str, list]:
    return {
        "id": ids,
        "name": [rng.choice(["a", "bb", None, "ccc" * 20, "Zürich"]) for _ in ids],
        "amount": [rng.choice([None, rng.uniform(-1e6, 1e6)]) for _ in ids],
        "note": [rng.choice([None, "x" * rng.randrange(1, 3000)]) for _ in ids],
        "day": [dt.date(2020, 1, 1) + dt.timedelta(days=rng.randrange(3000)) for _ in ids],
        "at": [dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=rng.randrange(10**12))
               for _ in ids],
        "price": [rng.choice([None, decimal.Decimal(rng.randrange(-10**8, 10**8)) / 100]) for _ in ids],
        "tags": [rng.choice([None, [], ["a", "b"]]) for _ in ids],
    }


def _batch(rng: random.Random, universe: int) -> pa.Table:
    # Some batches only update keys stored from the start (every change matches a stored row).
    if rng.random() < 0.3:
        ids = rng.sample(range(20), rng.randrange(1, 20))
    else:
        ids = rng.sample(range(universe), rng.randrange(1, 40))
    columns = _values(rng, ids)
    schema = SCHEMA
    if rng.random() < 0.3:  # a batch without some column: the stored value stays (update) / null (insert)
        drop = rng.choice(["amount", "tags", "day"])
        del columns[drop]
        schema = pa.schema([f for f in SCHEMA if f.name != drop])
    table = pa.table(columns, schema=schema)
    if rng.random() < 0.2:  # keys sent as int32: converted to the table's type
        table = table.set_column(0, pa.field("id", pa.int32()), table.column("id").cast(pa.int32()))
    deletes = rng.choice([0.0, 0.25])
    table = table.append_column(DELETE_FLAG, pa.array([rng.random() < deletes for _ in ids]))
    if rng.random() < 0.5:  # unchanged TOAST values of `note`: in some rows, in every row or in none
        kept = rng.choice([0.0, 0.5, 1.0])
        table = table.append_column(keep_flag("note"), pa.array([rng.random() < kept for _ in ids]))
    return table


def _start(path: Path, rng: random.Random) -> None:
    for first in range(0, rng.choice([20, 60, 120]), 20):  # one to six files of keys in runs
        ids = list(range(first, first + 20))
        write_deltalake(str(path), pa.table(_values(rng, ids), schema=SCHEMA), mode="append",
                        configuration=CDF_ENABLED)


def _rows(path: Path) -> list[dict]:
    return sorted(pa.table(DeltaTable(str(path)).to_pyarrow_table()).to_pylist(), key=lambda row: row["id"])


def _feed(path: Path, first: int) -> list[tuple]:
    feed = pa.table(DeltaTable(str(path)).load_cdf(starting_version=first)).drop_columns(["_commit_timestamp"])
    return sorted((tuple(sorted(row.items(), key=lambda item: item[0])) for row in feed.to_pylist()), key=repr)


def merge_both(fast: Path, reference: Path, rng: random.Random, batches: int, universe: int,
               rows: Callable[[Path], list[dict]]) -> None:
    """`batches` generated batches into both tables (`fast` through small commits, `reference` through
    delta-rs's MERGE), the tables' `rows` equal after each."""
    tables = DeltaRsTable(str(fast)), DeltaRsTable(str(reference), small_commits=False)
    for batch_id in range(batches):
        batch = _batch(rng, universe)
        for table in tables:
            table.merge(batch, ("id",), APP, batch_id)
        assert rows(fast) == rows(reference), f"batch {batch_id}"


def _engines(table: DeltaTable) -> list[str]:
    return [entry.get("engineInfo", "") for entry in table.history()]


@pytest.mark.parametrize("seed", SEEDS)
def test_small_commits_equal_the_merge(tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    if seed % 2:  # every file read back from storage, no rows kept in memory
        monkeypatch.setattr(data_file_rows, "KEPT_ROWS_BYTES", 0)
    rng = random.Random(seed)
    fast, reference = tmp_path / "fast", tmp_path / "reference"
    _start(fast, random.Random(seed))
    _start(reference, random.Random(seed))
    start = DeltaTable(str(fast)).version()
    merge_both(fast, reference, rng, 12, 160, _rows)
    assert _feed(fast, start + 1) == _feed(reference, start + 1), f"seed {seed}"
    assert DeltaTable(str(fast)).version() == DeltaTable(str(reference)).version()
    # The last batch's id, unless it changed nothing (deletes of absent keys): neither engine commits then.
    assert DeltaTable(str(fast)).transaction_version(APP) == DeltaTable(str(reference)).transaction_version(APP)
    engines = _engines(DeltaTable(str(fast)))
    assert engines.count(SMALL) >= 9, engines  # only deletes of absent keys MERGE
    assert SMALL not in _engines(DeltaTable(str(reference)))


def test_compound_keys_and_a_column_added_later(tmp_path: Path) -> None:
    """Two key columns; a batch with a new column goes to the MERGE (schema evolution), the next
    small commit keeps the added column."""
    schema = pa.schema([("tenant", pa.string()), ("id", pa.int32()), ("v", pa.string())])
    key = ("tenant", "id")
    for path in (tmp_path / "fast", tmp_path / "reference"):
        write_deltalake(str(path), pa.table({"tenant": ["a", "a", "b"], "id": [1, 2, 1], "v": ["1", "2", "3"]},
                                            schema=schema), configuration=CDF_ENABLED)
    fast, reference = DeltaRsTable(str(tmp_path / "fast")), DeltaRsTable(str(tmp_path / "reference"), small_commits=False)
    batches = [
        pa.table({"tenant": ["a", "b", "b"], "id": [1, 1, 2], "v": ["x", "y", "z"], DELETE_FLAG: [False, True, False]}),
        pa.table({"tenant": ["a"], "id": [2], "v": ["w"], "extra": [7], DELETE_FLAG: [False]}),
        pa.table({"tenant": ["a", "c"], "id": [2, 9], "v": ["u", "n"], DELETE_FLAG: [False, False]}),
    ]
    for batch_id, batch in enumerate(batches):
        for table in (fast, reference):
            table.merge(batch, key, APP, batch_id)
    rows = sorted(pa.table(DeltaTable(str(tmp_path / "fast")).to_pyarrow_table()).to_pylist(),
                  key=lambda r: (r["tenant"], r["id"]))
    assert rows == [{"tenant": "a", "id": 1, "v": "x", "extra": None}, {"tenant": "a", "id": 2, "v": "u", "extra": 7},
                    {"tenant": "b", "id": 2, "v": "z", "extra": None}, {"tenant": "c", "id": 9, "v": "n", "extra": None}]
    assert _feed(tmp_path / "fast", 1) == _feed(tmp_path / "reference", 1)
    engines = _engines(DeltaTable(str(tmp_path / "fast")))  # newest first
    assert engines[0] == SMALL and engines[1] != SMALL and engines[2] == SMALL, engines


def test_what_does_not_fit_is_merged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partitioned table, a value that does not convert, a key twice, too many bytes: MERGE (or its
    error), never a small commit."""
    partitioned = tmp_path / "partitioned"
    write_deltalake(str(partitioned), pa.table({"p": ["x"], "id": [1], "v": ["a"]}), partition_by=["p"],
                    configuration=CDF_ENABLED)
    DeltaRsTable(str(partitioned)).merge(pa.table({"p": ["x"], "id": [1], "v": ["b"], DELETE_FLAG: [False]}),
                                         ("id",), APP, 0)
    assert SMALL not in _engines(DeltaTable(str(partitioned)))

    plain = tmp_path / "plain"
    write_deltalake(str(plain), pa.table({"id": [1, 2], "v": ["a", "b"]}), configuration=CDF_ENABLED)
    commits = small.SmallCommits(str(plain))
    commits.load(DeltaTable(str(plain)))
    assert not commits.commit(pa.table({"id": ["not a number"], "v": ["b"], DELETE_FLAG: [False]}), ("id",), APP, 0)
    assert not commits.commit(pa.table({"id": [1, 1], "v": ["b", "c"], DELETE_FLAG: [False, False]}), ("id",), APP, 0)
    assert not commits.commit(pa.table({"id": [1], "v": ["b"], "new": [1], DELETE_FLAG: [False]}), ("id",), APP, 0)
    monkeypatch.setattr(small, "MAX_REWRITE_BYTES", 10)
    assert not commits.commit(pa.table({"id": [1], "v": ["b"], DELETE_FLAG: [False]}), ("id",), APP, 0)
    monkeypatch.undo()
    assert DeltaTable(str(plain)).version() == 0
    assert commits.commit(pa.table({"id": [1], "v": ["b"], DELETE_FLAG: [False]}), ("id",), APP, 0)
    assert DeltaTable(str(plain)).version() == 1


def test_files_kept_in_memory_are_rewritten_above_the_size_limit(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Above `MAX_REWRITE_BYTES`, a batch whose files' rows the small commits kept (they wrote them) is still a
    small commit, equal to the MERGE; once those rows are no longer kept, the MERGE."""
    fast, reference = tmp_path / "fast", tmp_path / "reference"
    for path in (fast, reference):
        write_deltalake(str(path), pa.table({"id": [1, 2], "v": ["a", "b"]}), configuration=CDF_ENABLED)
    tables = [DeltaRsTable(str(fast)), DeltaRsTable(str(reference), small_commits=False)]

    def merge(batch_id: int, ids: list[int]) -> None:
        batch = pa.table({"id": ids, "v": [f"{i}.{batch_id}" for i in ids], DELETE_FLAG: [False] * len(ids)})
        for table in tables:
            table.merge(batch, ("id",), APP, batch_id)

    merge(0, [1, 3])  # within the limit: a small commit rewriting the first file, whose rows it keeps
    monkeypatch.setattr(small, "MAX_REWRITE_BYTES", 10)
    merge(1, [3, 4])  # touches the file batch 0 wrote
    assert _engines(DeltaTable(str(fast)))[0] == SMALL
    for uri in DeltaTable(str(fast)).file_uris():  # the rows no longer kept (as when other tables' took their place)
        data_file_rows.KEPT.drop(str(fast), os.path.basename(uri))
    merge(2, [3, 5])
    assert _engines(DeltaTable(str(fast)))[0] != SMALL
    assert _feed(fast, 1) == _feed(reference, 1)
    assert sorted(DeltaTable(str(fast)).to_pyarrow_table().to_pylist(), key=lambda r: r["id"]) == sorted(
        DeltaTable(str(reference)).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])


def test_a_lost_race_gives_way_to_the_merge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer commits the next version after the snapshot was taken: seen before the commit (the
    snapshot is not current), or only when creating the log entry (the race); either way the small
    commit writes nothing to the log and the MERGE (on the new version) applies the batch."""
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"id": [1, 2], "v": ["a", "b"]}), configuration=CDF_ENABLED)
    commits = small.SmallCommits(str(path))
    snapshot = commits.load(DeltaTable(str(path)))
    write_deltalake(str(path), pa.table({"id": [3], "v": ["c"]}), mode="append")  # the other writer: version 1
    batch = pa.table({"id": [1, 4], "v": ["A", "d"], DELETE_FLAG: [False, False]})
    assert commits.current() is None and not commits.commit(batch, ("id",), APP, 0)
    commits.snapshot = snapshot
    monkeypatch.setattr(commits, "current", lambda: snapshot)  # the other commit lands after the check
    assert not commits.commit(batch, ("id",), APP, 0)
    assert commits.snapshot is None
    assert not [name for name in os.listdir(path / "_delta_log") if name.endswith(".tmp")]
    named = {json.loads(line)[kind]["path"] for name in os.listdir(path / "_delta_log") if name.endswith(".json")
             for line in (path / "_delta_log" / name).read_text().splitlines()
             for kind in ("add", "cdc") if kind in json.loads(line)}
    on_disk = {str(p.relative_to(path)) for p in path.rglob("*.parquet")}
    assert on_disk == named  # the files the lost commit wrote are gone
    assert DeltaTable(str(path)).version() == 1
    DeltaRsTable(str(path)).merge(batch, ("id",), APP, 0)
    assert sorted(pa.table(DeltaTable(str(path)).to_pyarrow_table()).to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "v": "A"}, {"id": 2, "v": "b"}, {"id": 3, "v": "c"}, {"id": 4, "v": "d"}]


def test_the_snapshot_follows_other_commits(tmp_path: Path) -> None:
    """Between small commits: another writer's append and an OPTIMIZE through the same table object; the
    snapshot loads again, and the kept rows of a file OPTIMIZE removed are not used."""
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"id": [1, 2], "v": ["a", "b"]}), configuration=CDF_ENABLED)
    table = DeltaRsTable(str(path))
    assert table.last_batch(APP) is None
    table.merge(pa.table({"id": [1], "v": ["A"], DELETE_FLAG: [False]}), ("id",), APP, 0)
    write_deltalake(str(path), pa.table({"id": [3], "v": ["c"]}), mode="append")
    assert table.last_batch(APP) == 0
    assert table.compact() == (2, 1)  # removes the file whose rows the small commits kept
    table.merge(pa.table({"id": [3, 2], "v": ["C", None], DELETE_FLAG: [False, True]}), ("id",), APP, 1)
    assert table.last_batch(APP) == 1
    table.merge(pa.table({"id": [1, 5], "v": ["AA", "e"], DELETE_FLAG: [False, False]}), ("id",), APP, 2)
    assert sorted(pa.table(DeltaTable(str(path)).to_pyarrow_table()).to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "v": "AA"}, {"id": 3, "v": "C"}, {"id": 5, "v": "e"}]
    engines = _engines(DeltaTable(str(path)))  # newest first: 2, 1, OPTIMIZE, append, 0, create
    assert [e == SMALL for e in engines] == [True, True, False, False, True, False], engines


def test_checkpoints_at_the_tables_interval(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"id": [1], "v": ["a"]}),
                    configuration={**CDF_ENABLED, "delta.checkpointInterval": "5"})
    table = DeltaRsTable(str(path))
    for batch_id in range(6):
        table.merge(pa.table({"id": [batch_id], "v": [str(batch_id)], DELETE_FLAG: [False]}), ("id",), APP, batch_id)
    last = json.loads((path / "_delta_log" / "_last_checkpoint").read_text())
    assert last["version"] == 5
    assert DeltaTable(str(path)).transaction_version(APP) == 5
    assert pc.sum(pa.table(DeltaTable(str(path)).to_pyarrow_table()).column("id")).as_py() == 0 + 1 + 2 + 3 + 4 + 5


def _naive(row: dict) -> dict:
    """A row with its timestamps as naive UTC (Spark's rows carry no zone; the session's is UTC)."""
    return {k: v.astimezone(dt.timezone.utc).replace(tzinfo=None) if isinstance(v, dt.datetime) and v.tzinfo else v
            for k, v in row.items()}


def test_delta_spark_reads_a_small_commit(tmp_path: Path, spark) -> None:  # noqa: ANN001 - the run's session
    rng = random.Random(7)
    path = tmp_path / "t"
    _start(path, rng)
    table = DeltaRsTable(str(path))
    for batch_id in range(4):
        table.merge(_batch(rng, 80), ("id",), APP, batch_id)
    assert SMALL in _engines(DeltaTable(str(path)))
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    spark_reads_as(spark, path, _rows)


def spark_reads_as(spark, path: Path, rows: Callable[[Path], list[dict]]) -> None:  # noqa: ANN001 - a session
    """delta-spark reads the table at `path` as `rows` reads it, and its change feed from version 1 as delta-rs."""
    found = [row.asDict(recursive=True) for row in spark.read.format("delta").load(str(path)).collect()]
    assert sorted(found, key=lambda row: row["id"]) == [_naive(row) for row in rows(path)]
    feed = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 1).load(str(path))
    spark_feed = sorted(
        (tuple(sorted({k: v for k, v in row.asDict(recursive=True).items() if k != "_commit_timestamp"}.items(),
                      key=lambda item: item[0])) for row in feed.collect()), key=repr)
    assert spark_feed == sorted((tuple(_naive(dict(row)).items()) for row in _feed(path, 1)), key=repr)

