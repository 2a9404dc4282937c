"""`range_reader.binary_array` against `pa.array(..., pa.binary())`: the same array for any values,
tombstones (None) and empty values included."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.kafka import range_reader
from connectors.kafka.range_reader import binary_array


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=50))
def test_the_joined_array_equals_arrows_own(items):
    built = binary_array(items)
    built.validate(full=True)
    assert built.equals(pa.array(items, pa.binary()))
    assert built.to_pylist() == items


def test_values_beyond_32_bit_offsets_are_left_to_arrow(monkeypatch):
    monkeypatch.setattr(range_reader, "_MAX_BINARY_BYTES", 5)
    calls = []
    real = pa.array

    def counted(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(range_reader.pa, "array", counted)
    assert binary_array([b"abc", b"def"]).to_pylist() == [b"abc", b"def"]
    assert calls == [[b"abc", b"def"]]
