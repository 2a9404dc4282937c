"""The Delta change-feed streaming source over real Delta tables (delta-rs), read through Spark."""

from __future__ import annotations

import datetime as dt
import json
import time
from decimal import Decimal

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.errors import StreamingQueryException

from connectors.delta.change_feed import (
    FORMAT_NAME,
    ChangeFeedSchemaChanged,
    ChangeFeedUnavailable,
    DeltaChangeFeedSource,
    read_batch,
    read_versions,
    spark_arrow_type,
)

SCHEMA = pa.schema([
    ("id", pa.int64()),
    ("name", pa.string()),
    ("amount", pa.decimal128(10, 2)),
    ("updated_at", pa.timestamp("us", tz="UTC")),
    ("local_at", pa.timestamp("us")),
    ("day", pa.date32()),
])
CDF = {"delta.enableChangeDataFeed": "true"}
# (version, change type, id, name) of the table built by `_build`.
EXPECTED = {
    (1, "insert", 1, "a"), (1, "insert", 2, "b"), (1, "insert", 3, "c"),
    (2, "update_preimage", 2, "b"), (2, "update_postimage", 2, "B"),
    (3, "delete", 3, "c"),
    (4, "insert", 4, "d"), (4, "update_preimage", 1, "a"), (4, "update_postimage", 1, "A"),
}


def _rows(ids: list[int], names: list[str]) -> pa.Table:
    return pa.table({
        "id": ids, "name": names,
        "amount": pa.array([Decimal(f"{i}.25") for i in ids], pa.decimal128(10, 2)),
        "updated_at": pa.array([1_700_000_000_000_000 + i for i in ids], pa.timestamp("us", tz="UTC")),
        "local_at": pa.array([1_600_000_000_000_000 + i for i in ids], pa.timestamp("us")),
        "day": pa.array([19_000 + i for i in ids], pa.date32()),
    }, schema=SCHEMA)


def _upsert(path: str, source: pa.Table) -> None:
    (DeltaTable(path).merge(source, "t.id = s.id", source_alias="s", target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all().execute())


def _build(path: str, configuration: dict[str, str] | None = None) -> None:
    """v0 create, v1 insert 1-3, v2 update 2 (merge), v3 delete 3, v4 insert 4 + update 1 (merge)."""
    DeltaTable.create(path, SCHEMA, configuration={**CDF, **(configuration or {})})
    steps = [
        lambda: write_deltalake(path, _rows([1, 2, 3], ["a", "b", "c"]), mode="append"),
        lambda: _upsert(path, _rows([2], ["B"])),
        lambda: DeltaTable(path).delete("id = 3"),
        lambda: _upsert(path, _rows([4, 1], ["d", "A"])),
    ]
    for step in steps:
        time.sleep(0.02)  # distinct commit timestamps (milliseconds) for startingTimestamp
        step()


class QueryFailed(Exception):
    """The streaming query ended with an error (its text is the message)."""


def _collect(spark, path, checkpoint, **options) -> list[tuple[int, pa.Table]]:
    """Run the source once with Trigger.AvailableNow; return [(batch_id, arrow table)]."""
    spark.dataSource.register(DeltaChangeFeedSource)
    reader = spark.readStream.format(FORMAT_NAME).option("path", path)
    for key, value in options.items():
        reader = reader.option(key, value)
    batches = []
    query = (
        reader.load().writeStream.foreachBatch(lambda df, bid: batches.append((bid, df.toArrow())))
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    )
    try:
        query.awaitTermination(600)
    except StreamingQueryException as error:
        raise QueryFailed(str(error)) from None
    assert not query.isActive
    return batches


def _offsets(checkpoint) -> list[tuple[int, int]]:
    """The source's end offset of every batch, from the checkpoint's offset log."""
    ends = {}
    for entry in (checkpoint / "offsets").iterdir():
        if entry.name.isdigit():
            document = json.loads(entry.read_text().splitlines()[2])
            ends[int(entry.name)] = (document["version"], document.get("row", 0))
    return [ends[batch] for batch in sorted(ends)]


def assert_driver_reads_equal(path, checkpoint, batches, first: tuple[int, int], max_rows=None, keys=()) -> None:
    """`read_batch` between each batch's offsets gives exactly the rows Spark's tasks gave (the export's read)."""
    ends = _offsets(checkpoint)
    starts = [first, *ends[:-1]]
    for (batch_id, table), start, end in zip(batches, starts, ends, strict=True):
        driver = pa.concat_tables([table.schema.empty_table(), *read_batch(
            path, None, table.schema, start, end, keys, max_rows)])
        assert driver.equals(table), (batch_id, start, end)


def _summary(table: pa.Table) -> list[tuple]:
    return [(r["_commit_version"], r["_change_type"], r["id"], r["name"]) for r in table.to_pylist()]


def test_feed_rows_and_spark_types(spark, workdir):
    path = str(workdir / "t")
    _build(path)
    batches = _collect(spark, path, workdir / "ck")
    rows = [row for _, table in batches for row in _summary(table)]
    assert len(rows) == len(EXPECTED) and set(rows) == EXPECTED
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)  # commit order
    feed = pa.concat_tables(t for _, t in batches)
    assert feed.schema == pa.schema([
        *SCHEMA, ("_change_type", pa.string()), ("_commit_version", pa.int64()),
        ("_commit_timestamp", pa.timestamp("us", tz="UTC")),
    ])
    # Every value equals what delta-rs itself reads from the feed.
    reference = pa.table(DeltaTable(path).load_cdf(starting_version=0))
    expected = sorted(
        (r["_commit_version"], r["_change_type"], r["id"], r["name"], r["amount"], r["updated_at"],
         r["local_at"], r["day"], r["_commit_timestamp"].replace(tzinfo=dt.timezone.utc))
        for r in reference.to_pylist()
    )
    got = sorted(
        (r["_commit_version"], r["_change_type"], r["id"], r["name"], r["amount"], r["updated_at"],
         r["local_at"], r["day"], r["_commit_timestamp"])
        for r in feed.to_pylist()
    )
    assert got == expected


def test_max_versions_per_trigger_bounds_each_batch(spark, workdir):
    path = str(workdir / "t")
    _build(path)
    batches = _collect(spark, path, workdir / "ck", maxVersionsPerTrigger="2")
    versions = [sorted({r[0] for r in _summary(table)}) for _, table in batches]
    # Versions [0, 1], [2, 3], [4]: version 0 (the create) has no feed rows.
    assert versions == [[1], [2, 3], [4]]
    assert {row for _, table in batches for row in _summary(table)} == EXPECTED
    assert_driver_reads_equal(path, workdir / "ck", batches, (0, 0))


def test_max_rows_per_trigger_splits_commits_between_keys(spark, workdir):
    path = str(workdir / "t")
    _build(path)
    batches = _collect(spark, path, workdir / "ck", maxRowsPerTrigger="2", keyColumns="id")
    summaries = [_summary(table) for _, table in batches]
    # v1's three inserts are split; v4's -U/+U of id 1 stay together (canonical order: id 1 before id 4).
    assert [len(rows) for rows in summaries] == [2, 1, 2, 1, 2, 1]
    assert [rows[0][:3] for rows in summaries[4:]] == [(4, "update_preimage", 1), (4, "insert", 4)]
    assert {row for rows in summaries for row in rows} == EXPECTED
    numbered = pa.concat_tables(t for _, t in batches)
    assert numbered.schema.names[-1] == "_commit_row"
    assert [r["_commit_row"] for r in numbered.to_pylist() if r["_commit_version"] == 1] == [0, 1, 2]
    assert_driver_reads_equal(path, workdir / "ck", batches, (0, 0), max_rows=2, keys=("id",))


def test_starting_version_and_timestamp(spark, workdir):
    path = str(workdir / "t")
    _build(path)
    from_three = [r for _, t in _collect(spark, path, workdir / "ck1", startingVersion="3") for r in _summary(t)]
    assert set(from_three) == {e for e in EXPECTED if e[0] >= 3} and len(from_three) == 4
    commit_ms = {c["version"]: c["timestamp"] for c in DeltaTable(path).history()}
    at_four = dt.datetime.fromtimestamp(commit_ms[4] / 1000, dt.timezone.utc).isoformat()
    from_four = [r for _, t in _collect(spark, path, workdir / "ck2", startingTimestamp=at_four) for r in _summary(t)]
    assert set(from_four) == {e for e in EXPECTED if e[0] == 4} and len(from_four) == 3
    latest = _collect(spark, path, workdir / "ck3", startingVersion="latest")
    assert sum(t.num_rows for _, t in latest) == 0


def _clean_log(path: str) -> None:
    """Checkpoint the log, then let log cleanup (retention 0) delete every entry before it."""
    table = DeltaTable(path)
    table.create_checkpoint()
    time.sleep(1.1)
    table.cleanup_metadata()


def test_cleaned_up_versions_fail_the_query_naming_table_and_versions(spark, workdir):
    path = str(workdir / "t")
    _build(path, {"delta.logRetentionDuration": "interval 0 seconds"})
    _clean_log(path)
    with pytest.raises(QueryFailed) as failure:
        _collect(spark, path, workdir / "ck", startingVersion="1")
    text = str(failure.value)
    assert "connectors.delta.change_feed.ChangeFeedUnavailable" in text
    assert f"table {path}: the change feed of versions 1..4 can no longer be read" in text


def test_unreadable_history_is_a_terminal_error(workdir):
    """Without Spark: log cleanup and VACUUM both end in ChangeFeedUnavailable, never in a silent gap."""
    schema = pa.schema([*SCHEMA, ("_change_type", pa.string()), ("_commit_version", pa.int64()),
                        ("_commit_timestamp", pa.timestamp("us", tz="UTC"))])
    cleaned = str(workdir / "cleaned")
    _build(cleaned, {"delta.logRetentionDuration": "interval 0 seconds"})
    _clean_log(cleaned)
    assert read_versions(cleaned, None, 4, 4, schema).num_rows == 3  # the checkpointed version is still there
    with pytest.raises(ChangeFeedUnavailable, match="versions 2..3"):
        read_versions(cleaned, None, 2, 3, schema)
    vacuumed = str(workdir / "vacuumed")
    _build(vacuumed)
    write_deltalake(vacuumed, _rows([9], ["z"]), mode="overwrite")
    DeltaTable(vacuumed).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    with pytest.raises(ChangeFeedUnavailable, match="VACUUM"):
        read_versions(vacuumed, None, 5, 5, schema)


def test_missing_table_gives_no_batches_until_it_exists(spark, workdir):
    path = str(workdir / "later")
    # Spark runs a first (empty) batch for any source; no rows and no error is what matters.
    assert sum(t.num_rows for _, t in _collect(spark, path, workdir / "ck")) == 0
    _build(path)
    rows = [r for _, t in _collect(spark, path, workdir / "ck") for r in _summary(t)]
    assert set(rows) == EXPECTED


def test_new_columns_ask_for_a_restart(workdir):
    """Without Spark: the reader of a running query meets a column added after it started."""
    path = str(workdir / "t")
    _build(path)
    source = DeltaChangeFeedSource({"path": path})
    reader = source.streamReader(source.schema())
    assert reader.latestOffset({"version": 0}, reader.getDefaultReadLimit()) == {"version": 5}
    write_deltalake(path, _rows([5], ["e"]).append_column("extra", pa.array([1.5])), mode="append",
                    schema_mode="merge")
    with pytest.raises(ChangeFeedSchemaChanged, match="columns extra appeared"):
        reader.latestOffset({"version": 5}, reader.getDefaultReadLimit())
    with pytest.raises(ChangeFeedSchemaChanged, match="restart the query"):
        list(reader.read(reader.partitions({"version": 5}, {"version": 6})[0]))
    # A restarted query sees the new column; older versions have it as null.
    restarted = DeltaChangeFeedSource({"path": path})
    fresh = restarted.streamReader(restarted.schema())
    rows = [r for b in fresh.read(fresh.partitions({"version": 1}, {"version": 6})[0]) for r in b.to_pylist()]
    assert [(r["_commit_version"], r["extra"]) for r in rows if r["id"] == 5] == [(5, 1.5)]
    assert all(r["extra"] is None for r in rows if r["_commit_version"] < 5)


def test_spark_arrow_types():
    assert spark_arrow_type(pa.string_view()) == pa.string()
    assert spark_arrow_type(pa.large_binary()) == pa.binary()
    assert spark_arrow_type(pa.timestamp("ms")) == pa.timestamp("us")
    assert spark_arrow_type(pa.timestamp("ns", tz="Europe/Paris")) == pa.timestamp("us", tz="UTC")
    assert spark_arrow_type(pa.uint64()) == pa.int64()
    nested = pa.struct([("tags", pa.large_list(pa.string_view())), ("m", pa.map_(pa.string_view(), pa.uint32()))])
    expected = pa.struct([("tags", pa.list_(pa.string())), ("m", pa.map_(pa.string(), pa.int64()))])
    assert spark_arrow_type(nested) == expected
