"""The rows a small commit keeps for the next batch (`data_file_rows.KeptRows`)."""

from __future__ import annotations

import pyarrow as pa

from connectors.delta import data_file_rows
from connectors.delta.data_file_rows import KeptRows


def test_kept_rows_are_one_chunk() -> None:
    """A commit's rows arrive in several chunks (updated rows, then inserted ones); kept as they are, each
    later take from them would join every column's chunks again."""
    part = pa.table({"id": [1, 2], "text": ["a", "b"]})
    kept = KeptRows()
    kept.put("/t", "f.parquet", pa.concat_tables([part, part, part]))
    rows = kept.get("/t", "f.parquet")
    assert rows is not None and rows.num_rows == 6
    assert [column.num_chunks for column in rows.columns] == [1, 1]


def test_kept_rows_age_out_by_bytes(monkeypatch) -> None:  # noqa: ANN001 - pytest's fixture
    rows = pa.table({"id": list(range(100))})
    monkeypatch.setattr(data_file_rows, "KEPT_ROWS_BYTES", rows.nbytes * 2)
    kept = KeptRows()
    for name in ("a", "b", "c"):
        kept.put("/t", name, rows)
    assert kept.get("/t", "a") is None
    assert kept.get("/t", "b") is not None and kept.get("/t", "c") is not None
