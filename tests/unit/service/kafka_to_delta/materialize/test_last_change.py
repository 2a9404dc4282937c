"""`last_rows` against the last row per key found in Python, over tables of many record batches."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from service.kafka_to_delta.materialize.last_change import MAX_PIECES, last_rows, taken_in_order

_KEYS = st.one_of(st.none(), st.sampled_from(["a", "b", "c", "dd", "é", ""]))


def _table(chunks: list[list[str | None]]) -> pa.Table:
    """One record batch per chunk: the key, the row's position and a text column to copy."""
    batches, position = [], 0
    for keys in chunks:
        positions = list(range(position, position + len(keys)))
        position += len(keys)
        batches.append(pa.record_batch({"k": pa.array(keys, pa.string()), "p": pa.array(positions, pa.int64()),
                                        "v": pa.array([f"value {p}" * (p % 3) for p in positions], pa.string())}))
    schema = pa.schema([("k", pa.string()), ("p", pa.int64()), ("v", pa.string())])
    return pa.Table.from_batches(batches, schema=schema)


def _expected(table: pa.Table) -> list[dict]:
    rows = table.to_pylist()
    last = {row["k"]: at for at, row in enumerate(rows)}
    return [rows[at] for at in sorted(last.values())]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_KEYS, max_size=12), max_size=8))
def test_last_rows_keeps_each_keys_last_row_in_source_order(chunks):
    table = _table(chunks)
    assert last_rows(table, "k").to_pylist() == _expected(table)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=8), st.data())
def test_taken_in_order_is_the_take_of_the_positions(sizes, data):
    table = _table([["a"] * size for size in sizes])
    positions = sorted(data.draw(st.sets(st.integers(0, max(0, table.num_rows - 1)), max_size=table.num_rows)))
    positions = [p for p in positions if p < table.num_rows]
    taken = taken_in_order(table, np.asarray(positions, np.int64))
    assert taken.to_pylist() == table.take(pa.array(positions, pa.int64())).to_pylist()


def test_a_table_without_repeated_keys_is_returned_as_it_is():
    table = _table([["a", "b"], ["c", None]])
    assert last_rows(table, "k") is table


def test_rows_kept_are_copied_from_their_own_batches_only():
    table = _table([["a", "b"], ["a", "c"], ["d"]])
    kept = last_rows(table, "k")
    assert [batch.num_rows for batch in kept.to_batches()] == [1, 2, 1]
    assert kept.column("p").to_pylist() == [1, 2, 3, 4]


def test_a_result_of_many_batches_is_joined_into_one():
    table = _table([["a", "b"] for _ in range(MAX_PIECES + 1)])
    kept = last_rows(table, "k")
    assert kept.column("p").to_pylist() == [2 * MAX_PIECES, 2 * MAX_PIECES + 1]
    many = _table([[f"k{i}", "x"] for i in range(MAX_PIECES + 1)])
    kept = last_rows(many, "k")
    assert len(kept.to_batches()) == 1
    assert kept.num_rows == MAX_PIECES + 2
