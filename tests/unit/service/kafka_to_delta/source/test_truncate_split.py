"""A source TRUNCATE wipes the changes before it in its partition; the rest apply after it."""

from __future__ import annotations

import pyarrow as pa

from service.kafka_to_delta.rows.names import Meta
from service.kafka_to_delta.source.batch_changes import without_truncated


def _changes(*rows: tuple[str, int, int]) -> pa.Table:
    return pa.table({
        Meta.TOPIC: [r[0] for r in rows], Meta.PARTITION: pa.array([r[1] for r in rows], pa.int32()),
        Meta.OFFSET: [r[2] for r in rows], Meta.KEY: [f"[{r[2]}]" for r in rows],
    })


def _where(table: pa.Table) -> list[tuple[int, int]]:
    return list(zip(table.column(Meta.PARTITION).to_pylist(), table.column(Meta.OFFSET).to_pylist()))


def test_changes_before_a_truncate_in_its_partition_are_wiped():
    changes = _changes(("t", 0, 1), ("t", 0, 3), ("t", 1, 0))
    assert _where(without_truncated(changes, [("t", 0, 2)])) == [(0, 3), (1, 0)]


def test_the_last_of_several_truncates_of_a_partition_counts():
    changes = _changes(("t", 0, 1), ("t", 0, 3), ("t", 0, 6))
    assert _where(without_truncated(changes, [("t", 0, 4), ("t", 0, 2)])) == [(0, 6)]


def test_no_truncate_keeps_everything():
    changes = _changes(("t", 0, 1), ("t", 0, 2))
    assert without_truncated(changes, []).num_rows == 2
