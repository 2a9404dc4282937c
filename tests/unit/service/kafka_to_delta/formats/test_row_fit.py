"""The screen of plain values never changes a verdict: records checked through `TypedRows` (the screen,
then only the columns it left unsure converted) get exactly the reasons a full conversion of every
record's rows (`misfit` over all declared columns) gives, for values that fit and values that do not."""

from __future__ import annotations

import base64
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from service.kafka_to_delta.formats.row_fit import TypedRows, misfit

TYPES = ["int64", "int32", "float64", "bool", "string", "decimal(12,2)", "decimal(3,0)", "decimal(2,1)",
         "timestamp_us_utc", "date32", "binary"]


def _b64(size: int, fill: int) -> str:
    return base64.b64encode(bytes([fill]) * size).decode()


EDGES = [None, True, 0, -1, 2**31, 2**63, -(2**63) - 1, 1.5, float("nan"), "plain", "é", "\ud800", "",
         "2026-11-30T07:00:00.123456789Z", "2026-13-01T00:00:00Z", "2026-11-30", "AAE=", "not base64!", "AAE",
         "=AAE", "QUJD\n", _b64(1, 0x7F), _b64(1, 0x80), _b64(2, 0x7F), _b64(5, 0x7F), _b64(5, 0x80), _b64(6, 0x7F),
         ["a", 1, None, True, 1.5], [["a"]], {"a": 1}, [], b"\x00\x01", Decimal("1.5"), Decimal("123456789012.5"),
         ["x", b"y"], ["\ud800"]]


def test_every_edge_value_in_every_type():
    for type_name in TYPES:
        for value in EDGES:
            typed = TypedRows()
            typed.add(0, [{"c": value}], {"c": type_name})
            reason = misfit([{"c": value}], {"c": type_name})
            expected = {} if reason is None else {0: f"row does not fit the columns its record declares: {reason}"}
            assert typed.misfits() == expected, (type_name, value)


VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    st.sampled_from(["plain", "é", "\ud800", "", "2026-11-30T07:00:00.123456789Z", "2026-13-01T00:00:00Z",
                     "2026-11-30", "AAE=", "not base64!", "AAE", "=AAE", "QUJD\n"]),
    st.builds(_b64, st.integers(0, 9), st.sampled_from([0, 0x7F, 0x80, 0xFF])),
    st.lists(st.one_of(st.text(max_size=3), st.integers(-5, 5), st.none(), st.booleans()), max_size=3),
    st.lists(st.lists(st.integers(0, 3), max_size=2), max_size=2),
    st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 3), max_size=2),
    st.sampled_from([b"\x00\x01", Decimal("1.5"), Decimal("123456789012.5"), ["x", b"y"]]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(TYPES), min_size=1, max_size=4), st.data())
def test_the_screen_never_changes_a_verdict(type_list, data):
    types = {f"c{i}": name for i, name in enumerate(type_list)}
    records = data.draw(st.lists(st.lists(st.fixed_dictionaries({}, optional={c: VALUES for c in types}),
                                          min_size=1, max_size=2), min_size=1, max_size=6))
    typed = TypedRows()
    for index, images in enumerate(records):
        typed.add(index, images, types)
    expected = {}
    for index, images in enumerate(records):
        reason = misfit(images, types)
        if reason is not None:
            expected[index] = f"row does not fit the columns its record declares: {reason}"
    assert typed.misfits() == expected


def test_plain_values_are_never_converted(monkeypatch):
    from service.kafka_to_delta.formats import row_fit

    converted = []
    monkeypatch.setattr(row_fit, "rows_to_table", lambda rows, types: converted.append(dict(types)))
    typed = TypedRows()
    types = {"id": "int64", "amount": "decimal(12,2)", "tags": "string", "at": "timestamp_us_utc", "body": "string"}
    typed.add(0, [{"id": 1, "amount": "AJiWgA==", "tags": ["a", "b"], "at": "2026-11-30T07:00:00Z", "body": "x"}], types)
    typed.add(1, [{"id": 2, "amount": None, "tags": None, "at": None, "body": "y"}], types)
    assert typed.misfits() == {}
    assert converted == [{"at": "timestamp_us_utc"}]
