"""`joined_tables`: typed image columns that two schema versions typed differently are left out (the rows are
then typed from their texts); any other conflict is still an error."""

from __future__ import annotations

import pyarrow as pa
import pytest

from service.kafka_to_delta.rows.arrow import joined_tables
from service.kafka_to_delta.rows.ipc import ipc_bytes, unpack_tables
from service.kafka_to_delta.rows.names import TYPED_IMAGE, TYPED_PREFIX


def _table(value_type: pa.DataType, value, row_type: pa.DataType = pa.string()) -> pa.Table:
    return pa.table({"row": pa.array(['{"v":1}'], row_type), TYPED_PREFIX + "v": pa.array([value], value_type),
                     TYPED_IMAGE: [True]})


def test_typed_images_of_one_type_join() -> None:
    joined = joined_tables([_table(pa.int64(), 1), _table(pa.int64(), 2)], "default")
    assert joined.column(TYPED_PREFIX + "v").to_pylist() == [1, 2]


@pytest.mark.parametrize("promote", ["default", "permissive"])
def test_typed_images_typed_differently_are_left_out(promote) -> None:
    joined = joined_tables([_table(pa.int64(), 1), _table(pa.string(), "1")], promote)
    assert joined.column_names == ["row"] and joined.num_rows == 2
    unpacked = unpack_tables([ipc_bytes(_table(pa.int64(), 1)), ipc_bytes(_table(pa.string(), "1"))])
    assert unpacked is not None and unpacked.column_names == ["row"]


def test_another_conflict_is_still_an_error() -> None:
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        joined_tables([_table(pa.int64(), 1), _table(pa.string(), "1", pa.binary())], "default")
