"""A database query whose MERGEs overlap the next batch's read (`overlap_merges`): every table ends
equal to its replay, and a batch Spark counted as done before its tables held it (a crash) is
committed from the checkpoint's staged copy first, once per table."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from connectors.kafka.range_reader import SOURCE_SCHEMA, ValueChunk
from connectors.kafka.source import KafkaRange
from service.config.settings import settings_from_mapping
from service.kafka_to_delta.database.query import DatabaseQuery
from service.kafka_to_delta.database.staged_batches import StagedBatches
from service.kafka_to_delta.source.database_ranges import TableReducers
from tests.support.run_seed import run_seed
from vocabulary.errors import DecodeError

TABLES = ("public_orders", "public_items")


class _Batch:
    """What the query takes from Spark's micro-batch: its rows as Arrow."""

    def __init__(self, payloads: pa.Table) -> None:
        self.payloads = payloads

    def toArrow(self) -> pa.Table:  # noqa: N802 - Spark's DataFrame method
        return self.payloads


def _batches(seed: int, count: int = 3, changes: int = 60) -> tuple[list[pa.Table], dict[str, dict[int, dict]]]:
    """`count` micro-batches of Debezium JSON changes to both tables (two partitions, a key in one), as
    the source's payload rows; and each table's live rows after them."""
    rng = random.Random(seed)
    live: dict[str, dict[int, dict]] = {table: {} for table in TABLES}
    offsets = {(table, p): 0 for table in TABLES for p in range(2)}
    reducers = TableReducers(_settings("/unused").databases[0])
    batches = []
    for _ in range(count):
        parts = []
        for table in TABLES:
            topic = "db.public." + table.split("_")[1]
            chunks = [ValueChunk(topic, p) for p in range(2)]
            for tick in range(changes):
                key = rng.randrange(20)
                before = live[table].get(key)
                if before is None:
                    op, after = "c", {"id": key, "name": f"n{tick}", "amount": rng.random()}
                elif rng.random() < 0.15:
                    op, after = "d", None
                else:
                    op, after = "u", {**before, "name": f"n{tick}-{rng.random()}"}
                chunk = chunks[key % 2]
                values = [json.dumps({"before": before, "after": after, "op": op, "ts_ms": tick,
                                      "source": {"schema": "public", "table": table, "lsn": tick}}).encode()]
                for value in values + ([None] if after is None else []):
                    chunk.values.append(value)
                    chunk.offsets.append(offsets[table, key % 2])
                    chunk.timestamps.append(1_700_000_000_000 + tick)
                    offsets[table, key % 2] += 1
                    chunk.first_key = chunk.first_key or json.dumps({"id": key}).encode()
                if after is None:
                    live[table].pop(key, None)
                else:
                    live[table][key] = after
            ranges = [(KafkaRange(topic, c.partition, c.offsets[0], c.offsets[-1] + 1), [c]) for c in chunks]
            joined = reducers.joined(table, ranges)
            parts.extend(joined if joined is not None else [  # else range by range, as the source does
                batch for kafka_range, (chunk,) in ranges
                for batch in reducers(kafka_range, table, lambda c=chunk: iter([_records(c)]), lambda c=chunk: iter([c]))])
        batches.append(pa.Table.from_batches(parts))
    return batches, live


def _records(chunk: ValueChunk) -> pa.RecordBatch:
    """A chunk's records as the Kafka source reads them (`SOURCE_SCHEMA`)."""
    rows = len(chunk.offsets)
    return pa.RecordBatch.from_pydict({
        "key": [chunk.first_key] * rows, "value": chunk.values, "topic": [chunk.topic] * rows,
        "partition": [chunk.partition] * rows, "offset": chunk.offsets,
        "timestamp": [t * 1000 for t in chunk.timestamps], "headers": [None] * rows,
        "watermark_floor": [None] * rows}, schema=SOURCE_SCHEMA)


def _settings(root: str, overlap: bool = True):
    return settings_from_mapping({
        "checkpoint_root": f"{root}/checkpoints", "lakehouse": {"root": f"{root}/tables"},
        "databases": [{"name": "db", "topic_pattern": r"db\.(?P<schema>[^.]+)\.(?P<table>[^.]+)",
                       "table_name": "{schema}_{table}", "overlap_merges": overlap}],
    })


def _query(root: str) -> DatabaseQuery:
    settings = _settings(root)
    query = DatabaseQuery(None, settings, settings.databases[0])  # type: ignore[arg-type] - delta-rs needs no Spark
    query._query_id = "q"  # Spark's query id: kept in the checkpoint, the same after a restart
    query._started.set()
    query._overlap = True
    return query


def _assert_replayed(root: str, live: dict[str, dict[int, dict]]) -> None:
    for table in TABLES:
        rows = DeltaTable(f"{root}/tables/{table}").to_pyarrow_table().sort_by("id").to_pylist()
        expected = [live[table][key] for key in sorted(live[table])]
        assert [{k: row[k] for k in ("id", "name", "amount")} for row in rows] == expected, table


def test_overlapped_merges_leave_every_table_equal_to_its_replay(tmp_path):
    batches, live = _batches(run_seed(1 << 30))
    query = _query(str(tmp_path))
    for batch_id, payloads in enumerate(batches):
        query._process_batch(_Batch(payloads), batch_id)
    query.close()
    _assert_replayed(str(tmp_path), live)
    assert StagedBatches(query.checkpoint).pending() == []
    assert query.committed_batches == len(batches)


def test_a_batch_staged_before_a_crash_is_committed_first_once_per_table(tmp_path):
    batches, live = _batches(5)
    first = _query(str(tmp_path))
    first._process_batch(_Batch(batches[0]), 0)
    first.close()
    # The crash: Spark counted batch 1 as done; one table holds it, the other does not.
    staged = StagedBatches(first.checkpoint)
    staged.write(1, batches[1])
    orders = batches[1].filter(pc.equal(batches[1].column("table"), TABLES[0]))
    first._commit(orders, 1, {}, 0.0, 0.0)
    staged.write(1, batches[1])
    staged.write(2, batches[2])  # planned but not done: Spark runs batch 2 again
    versions = {t: DeltaTable(f"{tmp_path}/tables/{t}").version() for t in TABLES}

    second = _query(str(tmp_path))
    second._process_batch(_Batch(batches[2]), 2)
    second.close()
    _assert_replayed(str(tmp_path), live)
    assert staged.pending() == []
    # orders: batch 2 only (batch 1 was in); items: batches 1 and 2
    after = {t: DeltaTable(f"{tmp_path}/tables/{t}").version() for t in TABLES}
    assert after == {TABLES[0]: versions[TABLES[0]] + 1, TABLES[1]: versions[TABLES[1]] + 2}


def test_a_failed_overlapped_batch_is_raised_by_the_next_and_stays_staged(tmp_path):
    batches, _ = _batches(9)
    query = _query(str(tmp_path))
    query._process_batch(_Batch(batches[0]), 0)
    broken = batches[1].set_column(batches[1].schema.get_field_index("primary_key"), "primary_key",
                                   pa.array(["id,name"] * batches[1].num_rows))  # not the tables' key
    query._process_batch(_Batch(broken), 1)  # returns: its MERGEs run in the background
    with pytest.raises(DecodeError, match="fields changed"):
        query._process_batch(_Batch(batches[2]), 2)
    assert StagedBatches(query.checkpoint).pending() == [1]  # the next start commits it first (and fails again)
