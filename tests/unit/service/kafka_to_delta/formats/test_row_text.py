"""`row_text` writes each row as orjson writes the row's dict (the record-by-record way's text), on drawn
columns of text (control characters, quotes, backslashes, non-ASCII), integers, floats, booleans, nulls
and lists, with drawn columns left out per row; `derandomize=True`."""

from __future__ import annotations

import numpy as np
import orjson
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from service.kafka_to_delta.formats.row_text import row_texts, unchanged_texts

_KINDS = {
    "text": (pa.string(), st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)),
    "integer": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "float": (pa.float64(), st.floats(allow_nan=True, allow_infinity=True)),
    "boolean": (pa.bool_(), st.booleans()),
    "list": (pa.list_(pa.string()), st.lists(st.none() | st.text(max_size=3), max_size=3)),
}


@settings(max_examples=200, derandomize=True, deadline=None)
@given(data=st.data())
def test_rows_are_written_as_orjson_writes_them(data) -> None:
    kinds = data.draw(st.lists(st.sampled_from(sorted(_KINDS)), min_size=1, max_size=5), label="columns")
    rows = data.draw(st.integers(1, 6), label="rows")
    names = [data.draw(st.text(max_size=4), label="name") + f"{i}" for i in range(len(kinds))]
    values = [[data.draw(st.none() | _KINDS[kind][1]) for _ in range(rows)] for kind in kinds]
    omitted = [np.array(data.draw(st.lists(st.booleans(), min_size=rows, max_size=rows))) for _ in kinds]
    columns = [pa.array(column, _KINDS[kind][0]) for kind, column in zip(kinds, values)]
    texts = row_texts(rows, names, columns, omitted)
    expected = [orjson.dumps({name: column[row] for name, column, left_out in zip(names, values, omitted)
                              if not left_out[row]}).decode() for row in range(rows)]
    assert texts is not None and texts.to_pylist() == expected
    listed = [[name for name, left_out in zip(names, omitted) if left_out[row]] for row in range(rows)]
    assert unchanged_texts(rows, names, omitted).to_pylist() == [orjson.dumps(n).decode() if n else None
                                                                  for n in listed]


def test_a_type_the_text_does_not_take_is_refused() -> None:
    assert row_texts(1, ["d"], [pa.array([1], pa.decimal128(5, 2))], [None]) is None
