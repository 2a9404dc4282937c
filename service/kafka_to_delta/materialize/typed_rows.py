"""Row images as JSON text -> typed columns in bulk: the fast twin of `rows_to_table` for the net rows
a stateful stage sends on (`payload.typed_changes`).

`rows_to_table` parses every row with `loads` and converts every value with one Python call;
`bulk_rows` parses all the texts at once with `pyarrow.json` (the declared types as its schema,
`bulk_values.parse_type`) and converts whole columns (`bulk_values.bulk_column`). It never decides
what only the reference can: a row holding a value `bulk_column` flags (a misfit) is typed by the
reference, that row alone; a batch `pyarrow.json` refuses, or holding a key outside the declared
types (the reference would infer a type for it), gives None, and the caller runs the reference
over the whole batch, which also decides errors.

`tests/unit/service/kafka_to_delta/materialize/test_typed_rows.py` holds the two equal.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.json as pj

from connectors.delta.arrow_types import TypeName, arrow_type, rows_to_table
from service.kafka_to_delta.formats.bulk_values import bulk_column, json_lines, parse_type
from service.kafka_to_delta.formats.debezium_json import loads

PIECE_ROWS = 16_384
"""Texts parsed together at most (the joined text of a piece stays far below Arrow's 2 GiB offsets)."""


def bulk_rows(texts: pa.Array, types: dict[str, str]) -> pa.Table | None:
    """`rows_to_table([loads(text) for text in texts], types)`, built in bulk; None where only the
    reference can tell (see the module). `texts`: one JSON object per row, no nulls."""
    if not len(texts) or texts.null_count:
        return None
    pieces = []
    for start in range(0, len(texts), PIECE_ROWS):
        piece = _piece(texts.slice(start, PIECE_ROWS), types)
        if piece is None:
            return None
        pieces.append(piece)
    return pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)


def _piece(texts: pa.Array, types: dict[str, str]) -> pa.Table | None:
    lines = json_lines(texts.cast(pa.binary()))
    if lines.count(b"\n") != len(texts) or b"\r" in lines:  # a raw line break would split a row
        return None
    parsed = _parsed(lines, len(texts), types)
    if parsed is None or not set(parsed.column_names) <= types.keys():
        return None
    arrays, misfits = [], np.zeros(len(texts), np.bool_)
    for name, type_name in types.items():
        if name not in parsed.column_names:
            arrays.append(pa.nulls(len(texts), arrow_type(type_name)))
            continue
        typed, misfit = bulk_column(parsed.column(name), type_name)
        arrays.append(typed)
        misfits |= misfit
    table = pa.Table.from_arrays(arrays, schema=pa.schema([(n, arrow_type(t)) for n, t in types.items()]))
    if not misfits.any():
        return table
    at = np.flatnonzero(misfits)
    try:
        reference = rows_to_table([loads(texts[int(i)].as_py().encode()) for i in at], types)
    except ValueError:  # the reference decides the error, over the whole batch
        return None
    order = np.arange(len(texts))
    order[at] = len(texts) + np.arange(len(at))
    return pa.concat_tables([table, reference]).take(pa.array(order))


def _parsed(lines: bytes, rows: int, types: dict[str, str]) -> pa.Table | None:
    """The lines parsed with the declared types' parse types; text columns parsed as text, or, where a
    text column holds other JSON (a Connect array or struct), as `pyarrow.json` infers them. Keys outside
    `types` are inferred too (so that the caller sees them)."""
    for nested in (False, True):
        try:
            fields = [(name, parse_type(type_name, nested)) for name, type_name in types.items()]
        except ValueError:  # a type name only the reference knows what to do with
            return None
        schema = pa.schema([(name, kind) for name, kind in fields if kind is not None])
        try:
            table = pj.read_json(pa.py_buffer(lines),
                                 read_options=pj.ReadOptions(use_threads=False, block_size=len(lines) + 1),
                                 parse_options=pj.ParseOptions(explicit_schema=schema,
                                                               unexpected_field_behavior="infer"))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            if nested or TypeName.STRING not in types.values():
                return None
            continue
        return table if table.num_rows == rows else None
    return None
