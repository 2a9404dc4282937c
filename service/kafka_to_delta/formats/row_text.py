"""Row images held as Arrow columns -> the compact JSON text the record-by-record way writes for them.

The changelog rows carry each image as text (`changelog_batch`: `compact_json` of the image, that is
orjson's output for the values as parsed). `row_texts` writes the same text for a whole column set at
once, from the values `pyarrow.json` parsed: per row an object of the columns in the given order, with
the columns a row leaves out (an unavailable-value placeholder, a null taken for unchanged) omitted.

Per value, as orjson writes it: integers in decimal, booleans, null; a string in quotes, escaping only
the quote, the backslash and control characters (other text, non-ASCII included, is written as it is:
the strings needing an escape are written by orjson itself); a float by orjson from its double; a
nested value (list, struct) by orjson from its Python value, struct fields in the column's order.
Columns of other types (times, decimals, binaries: the typed columns of Avro) are not taken: None.

What the text cannot show that the record's bytes did: the order of an object's keys when the record
wrote them differently from the column order, and a key the record left out where its column is known
(written as null). Such texts differ from the record-by-record way's, never their values.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from connectors.delta.arrow_types import one_array

_NEEDS_ESCAPE = r'[\x00-\x1f"\\]'


def value_texts(column: pa.Array | pa.ChunkedArray) -> pa.Array | None:
    """Each value of `column` as JSON text (null values as the text `null`); None for a type not taken."""
    column = one_array(column)
    kind = column.type
    if pa.types.is_null(kind):
        texts = pa.nulls(len(column), pa.string())
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        texts = _strings(column.cast(pa.string()))
    elif pa.types.is_integer(kind):
        texts = pc.cast(column, pa.string())
    elif pa.types.is_boolean(kind):
        texts = pc.if_else(column, "true", "false")
    elif pa.types.is_floating(kind) or _plain_nested(kind):
        texts = pa.array([None if v is None else orjson.dumps(v).decode() for v in column.to_pylist()], pa.string())
    else:
        return None
    return pc.fill_null(texts, "null")


def _plain_nested(kind: pa.DataType) -> bool:
    """A list or struct of lists, structs, text, numbers, booleans and nulls (values orjson writes as JSON
    wrote them)."""
    if pa.types.is_list(kind):
        return _plain_leaf(kind.value_type)
    if pa.types.is_struct(kind):
        return all(_plain_leaf(field.type) for field in kind)
    return False


def _plain_leaf(kind: pa.DataType) -> bool:
    return (pa.types.is_null(kind) or pa.types.is_string(kind) or pa.types.is_integer(kind)
            or pa.types.is_boolean(kind) or pa.types.is_floating(kind) or _plain_nested(kind))


def _strings(column: pa.Array) -> pa.Array:
    quoted = pc.binary_join_element_wise('"', column, '"', "")
    escaping = pc.fill_null(pc.match_substring_regex(column, _NEEDS_ESCAPE), False)
    if pc.any(escaping).as_py():
        written = [orjson.dumps(v).decode() for v in column.filter(escaping).to_pylist()]
        quoted = pc.replace_with_mask(quoted, escaping, pa.array(written, pa.string()))
    return quoted


def row_texts(rows: int, names: Sequence[str], columns: Sequence[pa.Array | pa.ChunkedArray],
              omitted: Sequence[np.ndarray | None]) -> pa.Array | None:
    """Per row, the JSON object of `columns` under `names` (in that order), leaving out column i in the rows
    where `omitted[i]` is True; None when a column's type is not taken (`value_texts`).

    Each member is written with its comma in front, an omitted one as empty text, and the members joined
    without a separator (Arrow's join that skips nulls drops a row whose members are all null); when the
    first column is never omitted it is written without the comma, else the one comma after the brace goes."""
    first_kept = not omitted or omitted[0] is None or not omitted[0].any()
    parts: list[pa.Array | str] = ["{"]
    for position, (name, column, left_out) in enumerate(zip(names, columns, omitted)):
        texts = value_texts(column)
        if texts is None:
            return None
        comma = "" if position == 0 and first_kept else ","
        member = pc.binary_join_element_wise(comma + orjson.dumps(name).decode() + ":", texts, "")
        if left_out is not None and left_out.any():
            member = pc.if_else(pa.array(left_out), "", member)
        parts.append(member)
    if len(parts) == 1:
        return pa.array(["{}"] * rows, pa.string())
    joined = pc.binary_join_element_wise(*parts, "}", "")
    return joined if first_kept else pc.replace_substring(joined, "{,", "{", max_replacements=1)


def unchanged_texts(rows: int, names: Sequence[str], omitted: Sequence[np.ndarray | None]) -> pa.Array:
    """Per row, the JSON list of the names it leaves out (`row_texts`' `omitted`), null where it leaves out
    none: the changelog rows' `unchanged`."""
    members = [pc.if_else(pa.array(left_out), "," + orjson.dumps(name).decode(), "")
               for name, left_out in zip(names, omitted) if left_out is not None and left_out.any()]
    if not members:
        return pa.nulls(rows, pa.string())
    joined = pc.binary_join_element_wise(*members, "") if len(members) > 1 else members[0]
    listed = pc.binary_join_element_wise("[", pc.utf8_slice_codeunits(joined, 1), "]", "")
    return pc.if_else(pc.equal(joined, ""), pa.scalar(None, pa.string()), listed)
