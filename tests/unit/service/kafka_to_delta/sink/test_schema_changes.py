"""The `schema_changes` policies on Arrow batches: what each does to a new column, a missing one, a
wider, a narrower and an incompatible type; errors name the table, the column, both types and the
first record concerned."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest

from connectors.delta.delta_rs import DeltaSchemaError
from service.kafka_to_delta.rows.names import Meta
from service.kafka_to_delta.sink.schema_changes import conform, widens

TABLE = "mem://t"
BIG = 2**31 + 5
EXISTING = pa.schema([("id", pa.int32()), ("v", pa.int32()), ("name", pa.string())])


def meta(rows: int) -> pa.Table:
    return pa.table({
        Meta.TOPIC: ["db.public.t"] * rows, Meta.PARTITION: [0] * rows, Meta.OFFSET: list(range(40, 40 + rows)),
        Meta.KEY: [f"[{i}]" for i in range(rows)],
    })


def batch(**columns: pa.Array) -> pa.Table:
    return pa.table({"id": pa.array([1, 2], pa.int32()), **columns})


@pytest.mark.parametrize(("old", "new", "expected"), [
    (pa.int8(), pa.int16(), True), (pa.int16(), pa.int64(), True), (pa.int32(), pa.int64(), True),
    (pa.int64(), pa.int32(), False), (pa.int32(), pa.int32(), False),
    (pa.float32(), pa.float64(), True), (pa.float64(), pa.float32(), False),
    (pa.decimal128(8, 2), pa.decimal128(12, 2), True), (pa.decimal128(8, 2), pa.decimal128(12, 4), True),
    (pa.decimal128(8, 2), pa.decimal128(9, 4), False), (pa.decimal128(12, 2), pa.decimal128(8, 2), False),
    (pa.date32(), pa.timestamp("us"), False), (pa.int32(), pa.string(), False), (pa.int64(), pa.float64(), False),
])
def test_widens(old, new, expected):
    assert widens(old, new) is expected


def test_no_table_yet_takes_the_batch_as_it_is():
    data = batch(v=pa.array([1, 2], pa.int64()))
    for policy in ("evolve", "lenient", "ignore", "fail"):
        conformed = conform(data, None, TABLE, policy)
        assert conformed.batch.equals(data) and conformed.widen == {}


@pytest.mark.parametrize("policy", ["evolve", "lenient", "ignore", "fail"])
def test_same_types_cast_to_the_table_and_missing_columns_are_nulls(policy):
    data = batch(v=pa.array([7, None], pa.int32()))
    conformed = conform(data, EXISTING, TABLE, policy, meta(2))
    assert conformed.widen == {}
    assert conformed.batch.schema == EXISTING
    assert conformed.batch.to_pylist() == [{"id": 1, "v": 7, "name": None}, {"id": 2, "v": None, "name": None}]


@pytest.mark.parametrize("policy", ["evolve", "lenient", "ignore", "fail"])
def test_an_all_null_column_fits_any_type(policy):
    conformed = conform(batch(name=pa.nulls(2, pa.int64())), EXISTING, TABLE, policy)
    assert conformed.batch.schema == EXISTING and conformed.widen == {}


@pytest.mark.parametrize("policy", ["evolve", "lenient"])
def test_evolve_and_lenient_widen_the_table(policy):
    data = batch(v=pa.array([BIG, 3], pa.int64()))
    conformed = conform(data, EXISTING, TABLE, policy, meta(2))
    assert conformed.widen == {"v": pa.int64()}
    assert conformed.batch.schema.field("v").type == pa.int64()
    assert conformed.batch.column("v").to_pylist() == [BIG, 3]


@pytest.mark.parametrize("policy", ["evolve", "lenient"])
def test_evolve_and_lenient_widen_decimals_and_floats(policy):
    existing = pa.schema([("id", pa.int32()), ("amount", pa.decimal128(8, 2)), ("ratio", pa.float32())])
    data = batch(amount=pa.array([Decimal("1234567890.12"), None], pa.decimal128(12, 2)),
                 ratio=pa.array([0.1, 0.2], pa.float64()))
    conformed = conform(data, existing, TABLE, policy)
    assert conformed.widen == {"amount": pa.decimal128(12, 2), "ratio": pa.float64()}
    assert conformed.batch.column("amount").to_pylist()[0] == Decimal("1234567890.12")


def test_evolve_widens_for_a_wider_source_type_and_lenient_once_a_value_needs_it():
    data = batch(v=pa.array([5, 6], pa.int64()), ratio=pa.array([0.5, 0.25], pa.float64()))
    existing = pa.schema([("id", pa.int32()), ("v", pa.int32()), ("ratio", pa.float32())])
    assert conform(data, existing, TABLE, "evolve").widen == {"v": pa.int64(), "ratio": pa.float64()}
    lenient = conform(data, existing, TABLE, "lenient")
    assert lenient.widen == {} and lenient.batch.schema == existing
    assert lenient.batch.column("v").to_pylist() == [5, 6] and lenient.batch.column("ratio").to_pylist() == [0.5, 0.25]


@pytest.mark.parametrize("policy", ["evolve", "lenient"])
def test_new_columns_are_kept_for_the_merge_to_add(policy):
    data = batch(v=pa.array([1, 2], pa.int32()), email=pa.array(["a", "b"]))
    conformed = conform(data, EXISTING, TABLE, policy)
    assert conformed.batch.column_names == ["id", "v", "name", "email"]
    assert conformed.widen == {}


@pytest.mark.parametrize("policy", ["evolve", "lenient", "ignore"])
def test_a_narrower_source_type_is_written_into_the_wider_column(policy):
    existing = pa.schema([("id", pa.int32()), ("v", pa.int64())])
    conformed = conform(batch(v=pa.array([1, 2], pa.int16())), existing, TABLE, policy)
    assert conformed.batch.schema == existing and conformed.widen == {}


def test_evolve_stops_on_a_type_the_column_cannot_change_to():
    data = batch(v=pa.array([None, "12"]))
    with pytest.raises(DeltaSchemaError) as stopped:
        conform(data, EXISTING, TABLE, "evolve", meta(2))
    message = str(stopped.value)
    assert "table mem://t" in message and "'v'" in message and "string" in message and "int32" in message
    assert "schema_changes: evolve" in message and "offset=41" in message and "12" not in message.split("offset")[0]


def test_lenient_keeps_values_of_another_type_that_fit():
    conformed = conform(batch(v=pa.array(["12", None])), EXISTING, TABLE, "lenient", meta(2))
    assert conformed.batch.column("v").to_pylist() == [12, None] and conformed.widen == {}


def test_lenient_stops_at_the_first_value_that_does_not_fit():
    existing = pa.schema([("id", pa.int32()), ("amount", pa.decimal128(12, 2))])
    data = batch(amount=pa.array([Decimal("1.2000"), Decimal("1.2345")], pa.decimal128(12, 4)))
    with pytest.raises(DeltaSchemaError) as stopped:
        conform(data, existing, TABLE, "lenient", meta(2))
    message = str(stopped.value)
    assert "'amount'" in message and "decimal128(12, 4)" in message and "decimal128(12, 2)" in message
    assert "offset=41" in message and "key=" in message and "1.2345" not in message


def test_ignore_drops_new_columns_and_never_widens():
    data = batch(v=pa.array([5, 6], pa.int64()), email=pa.array(["a", "b"]))
    conformed = conform(data, EXISTING, TABLE, "ignore", meta(2))
    assert conformed.batch.schema == EXISTING and conformed.widen == {}
    assert conformed.batch.column("v").to_pylist() == [5, 6]


def test_ignore_stops_on_a_value_that_does_not_fit_the_table():
    with pytest.raises(DeltaSchemaError, match=r"'v'.*int64.*int32.*offset=40"):
        conform(batch(v=pa.array([BIG, 1], pa.int64())), EXISTING, TABLE, "ignore", meta(2))


def test_fail_stops_on_a_new_column():
    with pytest.raises(DeltaSchemaError, match=r"table mem://t: column 'email' \(string\) is new.*schema_changes: fail.*offset=41"):
        conform(batch(email=pa.array([None, "b"])), EXISTING, TABLE, "fail", meta(2))


@pytest.mark.parametrize("kind", [pa.int64(), pa.int16(), pa.string()])
def test_fail_stops_on_any_other_type(kind):
    with pytest.raises(DeltaSchemaError, match=rf"column 'v' has type {kind} in this batch but int32 in the table"):
        conform(batch(v=pa.array([1, 2]).cast(kind)), EXISTING, TABLE, "fail", meta(2))


def test_without_meta_errors_name_no_record():
    with pytest.raises(DeltaSchemaError) as stopped:
        conform(batch(v=pa.array(["x", None])), EXISTING, TABLE, "lenient")
    assert "first at" not in str(stopped.value)


def test_string_representations_are_one_type():
    data = batch(name=pa.array(["a", "b"], pa.large_string()))
    conformed = conform(data, EXISTING, TABLE, "fail")
    assert conformed.batch.schema.field("name").type == pa.string()


def test_the_engines_widen_only_to_a_wider_type():
    from connectors.delta.delta_rs import to_widen

    current = pa.schema([("v", pa.int32()), ("s", pa.string())])
    assert to_widen(TABLE, current, {"v": pa.int64(), "s": pa.large_string(), "gone": pa.int64()}) == {"v": pa.int64()}
    assert to_widen(TABLE, pa.schema([("v", pa.int64())]), {"v": pa.int64()}) == {}  # repeated: nothing
    with pytest.raises(DeltaSchemaError, match="table mem://t: column 'v' cannot change from int64 to int32"):
        to_widen(TABLE, pa.schema([("v", pa.int64())]), {"v": pa.int32()})
