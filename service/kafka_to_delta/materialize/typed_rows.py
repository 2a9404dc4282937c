"""Row images as JSON text -> typed columns in bulk: the fast twin of `rows_to_table` for the net rows
a stateful stage sends on (`payload.typed_changes`).

`rows_to_table` parses every row with `loads` and converts every value with one Python call;
`bulk_rows` parses all the texts at once with `pyarrow.json` (the declared types as its schema,
`bulk_values.parse_type`) and converts whole columns (`bulk_values.bulk_column`). It never decides
what only the reference can: a row holding a value `bulk_column` flags (a misfit) is typed by the
reference, that row alone; a batch `pyarrow.json` refuses, or holding a key outside the declared
types (the reference would infer a type for it), gives None, and the caller runs the reference
over the whole batch, which also decides errors.

Where no row declares its column types (JSON without schema blocks), the reference infers them from
the values (`inferred_kinds`); `bulk_kinds` gives the same kinds from `pyarrow.json`'s own inference,
or None where Arrow's types cannot tell them, and its parse serves `bulk_rows` where it is the one
`bulk_rows` would make.

`tests/unit/service/kafka_to_delta/materialize/test_typed_rows.py` holds the two equal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.json as pj

from connectors.delta.arrow_types import TypeName, arrow_type, inferred_kinds, rows_to_table
from service.kafka_to_delta.formats.bulk_values import bulk_column, json_lines, parse_type
from service.kafka_to_delta.formats.debezium_json import loads

PIECE_ROWS = 16_384
"""Texts parsed together at most (the joined text of a piece stays far below Arrow's 2 GiB offsets)."""


@dataclass
class Inferred:
    """What `bulk_kinds` found: the kinds per column, and per piece of `PIECE_ROWS` texts the table Arrow
    parsed (which `bulk_rows` takes as its own parse where its column types are those it would ask for)."""

    kinds: dict[str, set[str]]
    pieces: list[pa.Table]


def bulk_rows(texts: pa.Array, types: dict[str, str], parsed: list[pa.Table] | None = None) -> pa.Table | None:
    """`rows_to_table([loads(text) for text in texts], types)`, built in bulk; None where only the
    reference can tell (see the module). `texts`: one JSON object per row, no nulls; `parsed`: the
    pieces `bulk_kinds` parsed of the same texts."""
    if not len(texts) or texts.null_count:
        return None
    pieces = []
    for number, start in enumerate(range(0, len(texts), PIECE_ROWS)):
        piece = _piece(texts.slice(start, PIECE_ROWS), types, parsed[number] if parsed else None)
        if piece is None:
            return None
        pieces.append(piece)
    return pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)


def _piece(texts: pa.Array, types: dict[str, str], inferred: pa.Table | None = None) -> pa.Table | None:
    parsed = _as_parsed(inferred, types) if inferred is not None else None
    if parsed is None:
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
    """The lines parsed with the declared types' parse types; a text column parsed as text, or, where it
    holds other JSON (a Connect array or struct, or a number), as `pyarrow.json` infers it. Such columns
    are learnt from Arrow's refusal, which names the column, and remembered per set of types (`_NESTED`),
    so that a table's text[] column costs one parse, not two. Keys outside `types` are inferred too (so
    that the caller sees them)."""
    known = tuple(types.items())
    nested = _NESTED.get(known, frozenset())
    while True:
        try:
            fields = [(name, parse_type(type_name, name in nested)) for name, type_name in types.items()]
        except ValueError:  # a type name only the reference knows what to do with
            return None
        schema = pa.schema([(name, kind) for name, kind in fields if kind is not None])
        try:
            table = pj.read_json(pa.py_buffer(lines),
                                 read_options=pj.ReadOptions(use_threads=False, block_size=len(lines) + 1),
                                 parse_options=pj.ParseOptions(explicit_schema=schema,
                                                               unexpected_field_behavior="infer"))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as refused:
            found = _NESTED_TEXT.search(str(refused))
            column = found.group(1) if found else None
            if column is None or column in nested or types.get(column) != TypeName.STRING:
                return None
            nested = nested | {column}
            continue
        if len(_NESTED) >= _NESTED_KEPT:
            _NESTED.clear()
        _NESTED[known] = nested
        return table if table.num_rows == rows else None


_NESTED: dict[tuple[tuple[str, str], ...], frozenset[str]] = {}
"""Per set of declared types (of this process): the text columns last found holding other JSON than text."""
_NESTED_KEPT = 64
_NESTED_TEXT = re.compile(r"Column\(/(.+)\) changed from string to \w+")


def _as_parsed(inferred: pa.Table, types: dict[str, str]) -> pa.Table | None:
    """An inferred parse as `_parsed` would give it for `types`, or None where it would differ: a text
    column parses as text (or, holding arrays or objects, as Arrow infers it), the other types as
    themselves; a column Arrow read as a time was text, and is parsed again."""
    kept = []
    for field in inferred.schema:
        if pa.types.is_null(field.type):
            continue  # all null: `_piece` gives the type's nulls, as for a column the piece lacks
        wanted = types.get(field.name)
        if wanted is None or _INFERRED_AS.get(wanted) is None or not _INFERRED_AS[wanted](field.type):
            return None
        kept.append(field.name)
    return inferred.select(kept)


_INFERRED_AS = {
    TypeName.INT64: pa.types.is_int64,
    TypeName.FLOAT64: pa.types.is_float64,
    TypeName.BOOL: pa.types.is_boolean,
    TypeName.STRING: lambda arrow: pa.types.is_string(arrow) or pa.types.is_list(arrow) or pa.types.is_struct(arrow),
}


def bulk_kinds(texts: pa.Array) -> Inferred | None:
    """`inferred_kinds([loads(text) for text in texts])`, from a parse of the texts with `pyarrow.json`'s
    own inference (in pieces of `PIECE_ROWS`, their kinds joined); None where only the reference can
    tell: a column whose values Arrow cannot hold in one type (the reference then says text). A column
    of floats holding integral values (written `2` the reference counts an integer, written `2.0` a
    float; Arrow keeps neither apart) has those rows read the reference way. `texts`: one JSON object
    per row, no nulls."""
    if not len(texts) or texts.null_count:
        return None
    kinds: dict[str, set[str]] = {}
    pieces = []
    for start in range(0, len(texts), PIECE_ROWS):
        piece = texts.slice(start, PIECE_ROWS)
        lines = json_lines(piece.cast(pa.binary()))
        if lines.count(b"\n") != len(piece) or b"\r" in lines:
            return None
        try:
            parsed = pj.read_json(pa.py_buffer(lines), read_options=pj.ReadOptions(use_threads=False,
                                                                                  block_size=len(lines) + 1))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        if parsed.num_rows != len(piece):
            return None
        for field in parsed.schema:
            kind = _kind(field.name, field.type, parsed.column(field.name), piece)
            if kind is None:
                return None
            kinds.setdefault(field.name, set()).update(kind)
        pieces.append(parsed)
    return Inferred(kinds, pieces)


def _kind(name: str, arrow: pa.DataType, column: pa.ChunkedArray, texts: pa.Array) -> set[str] | None:
    if pa.types.is_null(arrow):
        return set()
    if pa.types.is_boolean(arrow):
        return {TypeName.BOOL}
    if pa.types.is_int64(arrow):
        return {TypeName.INT64}
    if pa.types.is_float64(arrow):
        values = column.combine_chunks().to_numpy(zero_copy_only=False)
        integral = values == np.floor(values)  # false for nulls (NaN; JSON has none of its own)
        kinds = {TypeName.FLOAT64} if (~integral & ~np.isnan(values)).any() else set()
        if integral.any():  # `2` or `2.0`: the rows' own text tells, read the reference way
            try:
                rows = [loads(texts[int(i)].as_py().encode()) for i in np.flatnonzero(integral)]
            except ValueError:
                return None
            kinds |= inferred_kinds([{name: row.get(name)} for row in rows if isinstance(row, dict)]).get(name, set())
        return kinds
    if pa.types.is_string(arrow) or pa.types.is_timestamp(arrow) or pa.types.is_list(arrow) \
            or pa.types.is_struct(arrow):
        return {TypeName.STRING}  # text, ISO text Arrow read as a time, arrays and objects: text to the reference
    return None
