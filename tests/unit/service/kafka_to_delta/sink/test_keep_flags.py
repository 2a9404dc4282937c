"""The keep flags of a batch's rows (`merge_sink._with_keep_flags`): one per column some row left unchanged."""

from __future__ import annotations

import pyarrow as pa

from connectors.delta.merge_plan import keep_flag
from service.kafka_to_delta.sink.merge_sink import _with_keep_flags


def test_one_flag_per_column_a_row_left_unchanged() -> None:
    batch = pa.table({"id": [1, 2, 3, 4, 5], "body": ["a", None, None, "d", None]})
    unchanged = pa.chunked_array([['["body"]', None], ['["body","note"]', "[]", '["id","note"]']])
    flagged = _with_keep_flags(batch, unchanged, ("id",))
    assert flagged.column_names == ["id", "body", keep_flag("body"), "note", keep_flag("note")]
    assert flagged.column(keep_flag("body")).to_pylist() == [True, False, True, False, False]
    assert flagged.column(keep_flag("note")).to_pylist() == [False, False, True, False, True]
    assert flagged.column("note").null_count == 5  # a column the batch lacks: null, its stored value kept
    assert _with_keep_flags(batch, unchanged, ("id",), only_batch_columns=True).column_names == [
        "id", "body", keep_flag("body")]


def test_no_flags_where_no_row_left_a_column_unchanged() -> None:
    batch = pa.table({"id": [1, 2]})
    assert _with_keep_flags(batch, pa.array([None, None], pa.string()), ("id",)) is batch
    assert _with_keep_flags(batch, pa.array(["[]", None], pa.string()), ("id",)).column_names == ["id"]
