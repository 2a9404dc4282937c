"""The envelope fields a bulk parse needs, cut out of each value (`envelope_fields.kept_fields`)."""

from __future__ import annotations

import json

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from service.kafka_to_delta.formats.envelope_fields import kept_fields

NAMES = ("op", "before", "after")
_SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
            | st.floats(allow_nan=False, allow_infinity=False) | st.text())
_VALUES = st.recursive(
    _SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)
_FIELDS = st.sampled_from(["op", "before", "after", "source", "ts_ms", "OP", "transaction"])
_DOCUMENTS = st.dictionaries(_FIELDS, _VALUES)
_SEPARATORS = st.sampled_from([(",", ":"), (", ", ": "), (" , ", " : ")])


def _kept(values: list[bytes]) -> tuple[list, list[bool]]:
    buffer, refused = kept_fields(pa.array(values, pa.binary()), NAMES)
    return [json.loads(line) for line in buffer.splitlines()], refused.tolist()


def test_the_named_fields_are_kept_as_written_in_their_order_a_missing_one_as_null() -> None:
    values = [b'{"source": {"a": [1, {"b": 2}]}, "after" : {"id" : 1, "t": "x y"}, "op": "c", "ts_ms": 5}',
              b'{"op":"d","before":{"id":2}}']
    buffer, refused = kept_fields(pa.array(values, pa.binary()), NAMES)
    assert buffer == (b'{"op":"c","before":null,"after":{"id" : 1, "t": "x y"}}\n'
                      b'{"op":"d","before":{"id":2},"after":null}\n')
    assert not refused.any()


def test_values_that_are_not_one_json_object_are_refused_and_the_others_kept() -> None:
    values = [b'{"op":"c"}', b'[1]', b'{"op":"c","ts":NaN}', b'{"op":"u"} {"op":"d"}', b'{"op":"c","s":"\\ud800"}',
              b'{"op":"c","op":"d","after":{"id":3}}', b'{"\\u006fp":"r"}']
    kept, refused = _kept(values)
    assert refused == [False, True, True, True, True, False, False]
    assert kept == [{"op": "c", "before": None, "after": None}, {"op": "d", "before": None, "after": {"id": 3}},
                    {"op": "r", "before": None, "after": None}]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_DOCUMENTS, _SEPARATORS), max_size=6))
def test_the_fields_kept_are_those_python_reads(documents) -> None:
    values = [json.dumps(document, separators=separators).encode() for document, separators in documents]
    kept, refused = _kept(values)
    assert not any(refused)
    assert kept == [{name: document.get(name) for name in NAMES} for document, _ in documents]
