"""Kafka Connect JSON wrappers of one range, told apart by their bytes and cut open.

The JSON converter writes `{"schema": S, "payload": P}` with the same S record after record,
until a DDL change brings the next version. A layout is the bytes around P of one such record
(`prefix`, `suffix`), confirmed by a full parse: any value that starts with the prefix and ends
with the suffix wraps that same schema, so its payload is the slice between them and is parsed
in bulk. Whitespace (`json.dumps`'s `", "` and `": "`) and key order (the payload first) are
only bytes of the prefix or suffix, so every layout a producer writes consistently is learnt.

A value that looks like a wrapper but whose layout cannot be confirmed (or a range with more than
`MAX_LAYOUTS` schema versions) is an odd record: the caller decodes it the reference way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import repeat
from operator import getitem
from typing import Any, Iterable, cast

import numpy as np
import pyarrow as pa

from connectors.delta.connect_types import (
    CONNECT_FIELD,
    CONNECT_FIELDS,
    CONNECT_STRUCT,
    CONNECT_TYPE,
)
from service.kafka_to_delta.formats.debezium_json import JsonDocuments, is_wrapper, loads
from vocabulary.changes import Envelope
from vocabulary.errors import DecodeError

MAX_LAYOUTS = 16
"""Schema versions learnt per range; beyond them, values of unknown layouts are odd records."""
BARE = -1
"""Group of values without a wrapper (documents without a schema block)."""
ODD = -2
"""Group of values the caller decodes the reference way."""
_LOOKS_WRAPPED = re.compile(rb'[\t\n\f\r ]*\{[\t\n\f\r ]*"(schema|payload)"[\t\n\f\r ]*:')
_PAYLOAD_KEY = re.compile(rb'"payload"\s*:\s*')
_SCHEMA_AFTER = re.compile(rb'\s*,\s*"schema"\s*:')
_NESTED_CONNECT_TYPES = (CONNECT_STRUCT, "array", "map")


@dataclass(frozen=True)
class Layout:
    """One schema version of a range: the bytes around its payload and its column types."""

    prefix: bytes
    suffix: bytes
    types: dict[str, str]
    nested: dict[str, pa.DataType | None]
    """Declared columns holding structs, arrays or maps (stored as JSON text), with the Arrow type
    their values are parsed as (None: inferred)."""

    def __hash__(self) -> int:
        return hash((self.prefix, self.suffix))


_JSON_PRIMITIVES = {"int8": pa.int64(), "int16": pa.int64(), "int32": pa.int64(), "int64": pa.int64(),
                    "float32": pa.float64(), "float64": pa.float64(), "float": pa.float64(), "double": pa.float64(),
                    "boolean": pa.bool_(), "string": pa.string(), "bytes": pa.string()}
"""How a Connect primitive's JSON value is parsed (bytes are base64 text)."""


def _json_type(field: Any) -> pa.DataType | None:
    """The Arrow type of a nested Connect value as JSON (arrays and structs of primitives), or None:
    left to `pyarrow.json`'s inference."""
    if not isinstance(field, dict):
        return None
    kind = field.get(CONNECT_TYPE)
    if kind == "array":
        item = field.get("items")
        primitive = _JSON_PRIMITIVES.get(str(item.get(CONNECT_TYPE))) if isinstance(item, dict) else None
        return pa.list_(primitive) if primitive is not None else None
    if kind == CONNECT_STRUCT and isinstance(field.get(CONNECT_FIELDS), list):
        children = []
        for child in field[CONNECT_FIELDS]:
            primitive = _JSON_PRIMITIVES.get(str(child.get(CONNECT_TYPE))) if isinstance(child, dict) else None
            if primitive is None or not isinstance(child.get(CONNECT_FIELD), str):
                return None
            children.append(pa.field(child[CONNECT_FIELD], primitive))
        return pa.struct(children)
    return None


def _nested_columns(schema: Any, images: tuple[str, ...]) -> dict[str, pa.DataType | None]:
    """Row columns whose Connect type is a struct, an array or a map (VariableScaleDecimal and
    Geometry are structs), with the Arrow type their JSON is parsed as (None: inferred)."""
    fields = schema.get(CONNECT_FIELDS) if isinstance(schema, dict) else None
    if not isinstance(fields, list):
        return {}
    by_name = {f.get(CONNECT_FIELD): f for f in fields if isinstance(f, dict)}
    image = next((by_name[n] for n in images if isinstance(by_name.get(n), dict)
                  and by_name[n].get(CONNECT_TYPE) == CONNECT_STRUCT), None)
    row_fields = image.get(CONNECT_FIELDS) if image is not None else None
    if not isinstance(row_fields, list):
        return {}
    return {f[CONNECT_FIELD]: _json_type(f) for f in row_fields
            if isinstance(f, dict) and f.get(CONNECT_TYPE) in _NESTED_CONNECT_TYPES}


def learn_layout(value: bytes, documents: JsonDocuments) -> Layout | None:
    """The layout of one wrapper, confirmed by parsing it in full; None when it is not a wrapper or
    its payload cannot be cut out by bytes alone."""
    try:
        document = loads(value)
        if not is_wrapper(document):
            return None
        payload, schema = document[Envelope.PAYLOAD], document[Envelope.SCHEMA]
        _, types = documents(value)
    except (DecodeError, ValueError):  # UnicodeDecodeError included
        return None
    if types is None or not isinstance(payload, dict):
        return None
    stripped = value.rstrip()
    ends = [len(stripped) - 1] + [m.start() for m in _SCHEMA_AFTER.finditer(value)]
    for start in (m.end() for m in _PAYLOAD_KEY.finditer(value)):
        for end in ends:
            if end <= start:
                continue
            piece = value[start:end].rstrip()
            if not piece.startswith(b"{") or not piece.endswith(b"}"):
                continue
            end = start + len(piece)
            try:
                if loads(piece) != payload or loads(value[:start] + b"null" + value[end:]) != {
                        Envelope.SCHEMA: schema, Envelope.PAYLOAD: None}:
                    continue
            except ValueError:
                continue
            return Layout(value[:start], value[end:], types, _nested_columns(schema, documents.layout.images))
    return None


class Layouts:
    """The layouts learnt over one range; `split` sorts a chunk's values into them."""

    def __init__(self, documents: JsonDocuments) -> None:
        self.documents = documents
        self.known: list[Layout] = []

    def split(self, values: list[bytes]) -> tuple[np.ndarray, list[bytes]]:
        """(group of each value: a layout index, `BARE` or `ODD`; each value's payload bytes: the
        slice inside its wrapper, the value itself when bare).

        The values are cut as bytes, so that only the payloads parsed are copied into Arrow (a Debezium
        value is mostly its schema block): by the layouts known, then by the layout learnt from the first value
        left that looks wrapped, until none is left or `MAX_LAYOUTS` were tried."""
        groups = np.full(len(values), BARE, np.int32)
        payloads = list(values)
        rest = list(range(len(values)))
        cut, tried = 0, 0
        while rest:
            for index in range(cut, len(self.known)):
                rest = self._cut(values, rest, index, groups, payloads)
            cut = len(self.known)
            wrapped = [position for position in rest if _LOOKS_WRAPPED.match(values[position])]
            if not wrapped:
                break
            if tried >= MAX_LAYOUTS or len(self.known) >= MAX_LAYOUTS:
                groups[wrapped] = ODD
                break
            first = wrapped[0]
            learnt = learn_layout(values[first], self.documents)
            tried += 1
            if learnt is None or learnt in self.known:
                groups[first] = ODD
                rest.remove(first)
                continue
            self.known.append(learnt)
        return groups, payloads

    def _cut(self, values: list[bytes], rest: list[int], index: int, groups: np.ndarray,
             payloads: list[bytes]) -> list[int]:
        """Cut the values at `rest` of layout `index` (their group and payload set); the others."""
        layout = self.known[index]
        chosen = values if len(rest) == len(values) else [values[position] for position in rest]
        # bytes' own methods mapped over the values: no Python bytecode runs per value
        matched = np.fromiter(map(bytes.startswith, chosen, repeat(layout.prefix)), np.bool_, len(chosen))
        matched &= np.fromiter(map(bytes.endswith, chosen, repeat(layout.suffix)), np.bool_, len(chosen))
        positions = np.asarray(rest, np.int64)
        at = positions[matched]
        groups[at] = index
        inside = slice(len(layout.prefix), -len(layout.suffix) if layout.suffix else None)
        if len(at) == len(values):  # every value of the chunk: positions 0..n-1
            payloads[:] = cast("Iterable[bytes]", map(getitem, values, repeat(inside)))
        else:
            for position in at.tolist():
                payloads[position] = values[position][inside]
        return positions[~matched].tolist()
