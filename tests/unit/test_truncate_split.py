"""A source TRUNCATE wipes the changes before it in its partition; the rest apply after it."""

from __future__ import annotations

import pyarrow as pa

from service.kafka_to_delta.pipeline import _split_truncates


def _changes(*rows: tuple[str, int, int, str]) -> pa.Table:
    return pa.table({
        "topic": [r[0] for r in rows], "partition": pa.array([r[1] for r in rows], pa.int32()),
        "offset": [r[2] for r in rows], "kind": [r[3] for r in rows], "key": [f"[{r[2]}]" for r in rows],
    })


def test_changes_before_a_truncate_in_its_partition_are_wiped():
    changes = _changes(("t", 0, 1, "+U"), ("t", 0, 2, "TRUNCATE"), ("t", 0, 3, "+U"), ("t", 1, 0, "-D"))
    kept, truncate = _split_truncates(changes)
    assert truncate
    assert list(zip(kept.column("partition").to_pylist(), kept.column("offset").to_pylist())) == [(0, 3), (1, 0)]


def test_no_truncate_keeps_everything():
    changes = _changes(("t", 0, 1, "+U"), ("t", 0, 2, "-D"))
    kept, truncate = _split_truncates(changes)
    assert not truncate and kept.num_rows == 2
