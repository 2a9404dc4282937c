"""Do a record's rows fit the columns the record declares (Connect schema block, Avro)?

A value that does not fit its declared type (text in an int64 column, an integer beyond 64 bits,
a timestamp out of range), or a column named like a declared one but for case (Delta column
names are case-insensitive), would fail the sink's conversion or the table's schema for the
whole micro-batch and stop the pipeline on a record that is simply bad; the decoder rejects such
a record instead, under `decode_error_handling`. The verdict is the sink's own conversion (`rows_to_table`).
A screen of plain values (integers in range, floats, booleans, text, a flat array of JSON scalars in a
text column, a Connect Decimal's bytes that cannot exceed its precision) vouches for most values without
it; only the columns it cannot vouch for (ISO text timestamps, Avro's decimals, a wrong type) are
converted, together at the end of the batch per column-type map, and record by record only when that fails.
"""

from __future__ import annotations

import base64
import re
from typing import Any, Sequence

from connectors.delta.arrow_types import DECIMAL_PATTERN, TypeName, arrow_type, rows_to_table

_INT64 = (-(2**63), 2**63 - 1)
INT_RANGES: dict[str, tuple[int, int]] = {  # the values each integer-coded type holds
    TypeName.INT8: (-(2**7), 2**7 - 1),
    TypeName.INT16: (-(2**15), 2**15 - 1),
    TypeName.INT32: (-(2**31), 2**31 - 1),
    TypeName.INT64: _INT64,
    TypeName.DATE32: (-(2**31), 2**31 - 1),  # epoch days
    TypeName.TIMESTAMP_MS: (-(2**63 // 1000), (2**63 - 1) // 1000),  # stored in microseconds
    TypeName.TIMESTAMP_US: _INT64,
    TypeName.TIMESTAMP_NS: _INT64,
    TypeName.TIMESTAMP_US_UTC: _INT64,
}
_FLOAT_INT_BOUND = 2**1023  # float() of a larger integer may overflow
_SURROGATE = re.compile("[\ud800-\udfff]")
_INT, _FLOAT, _BOOL, _TEXT, _DECIMAL = "int", "float", "bool", "text", "decimal"
_JSON_SCALARS = (str, int, float, bool, type(None))
_MISFIT = "row does not fit the columns its record declares"
BARE_MISFIT = "row does not fit the column types other records of its Kafka range declare"
"""The reason of a record without column types whose values do not fit those its range declares."""


def _screen(types: dict[str, str]) -> tuple[tuple[str, str, int, int], ...]:
    """Per column of a type map: (name, kind of plain value that surely fits, integer range; for a
    decimal, the most bytes of an unscaled value that cannot exceed its precision)."""
    columns = []
    for name, type_name in types.items():
        if type_name in INT_RANGES:
            columns.append((name, _INT, *INT_RANGES[type_name]))
        elif type_name in TypeName.FLOATS:
            columns.append((name, _FLOAT, -_FLOAT_INT_BOUND, _FLOAT_INT_BOUND))
        elif type_name == TypeName.BOOL:
            columns.append((name, _BOOL, 0, 0))
        elif type_name == TypeName.STRING:
            columns.append((name, _TEXT, 0, 0))
        elif DECIMAL_PATTERN.match(type_name):
            columns.append((name, _DECIMAL, 0, _decimal_bytes(arrow_type(type_name).precision)))
        else:
            columns.append((name, "", 0, 0))  # no plain value vouched for
    return tuple(columns)


def _decimal_bytes(precision: int) -> int:
    """The most bytes of a two's-complement unscaled value that always has at most `precision` digits."""
    size = 0
    while 2 ** (8 * (size + 1) - 1) <= 10**precision:
        size += 1
    return size


def _unsure(image: dict, columns: tuple[tuple[str, str, int, int], ...]) -> tuple[str, ...]:
    """The columns of `image` whose values the screen cannot vouch for (empty: the image surely fits)."""
    unsure: tuple[str, ...] = ()
    for name, kind, low, high in columns:
        value = image.get(name)
        if value is None:
            continue
        kind_of = type(value)
        if kind == _INT:
            fits = kind_of is int and low <= value <= high
        elif kind == _FLOAT:
            fits = kind_of is float or (kind_of is int and low <= value <= high)
        elif kind == _BOOL:
            fits = kind_of is bool
        elif kind == _TEXT:
            if kind_of is str:
                fits = value.isascii() or _SURROGATE.search(value) is None
            else:  # written as its JSON text (ASCII): any flat array of JSON scalars
                fits = kind_of is list and all(type(item) in _JSON_SCALARS for item in value)
        elif kind == _DECIMAL:
            fits = kind_of is str and _decimal_fits(value, high)
        else:
            fits = False
        if not fits:
            unsure += (name,)
    return unsure


def _decimal_fits(text: str, most_bytes: int) -> bool:
    """Connect's Decimal: the base64 of an unscaled two's-complement value no wider than `most_bytes`."""
    if len(text) > 4 * ((most_bytes + 2) // 3):
        return False
    try:
        return 0 < len(base64.b64decode(text, validate=True)) <= most_bytes
    except ValueError:  # not base64 (binascii.Error), or not ASCII
        return False


def misfit(images: Sequence[dict | None], types: dict[str, str]) -> str | None:
    """Why `images` do not fit `types` as the sink converts them (`rows_to_table`); None: they fit."""
    rows: list[dict | None] = list(images)
    try:
        rows_to_table(rows, types)
    except ValueError as exc:  # names the column and the type, never a value
        return str(exc)
    return None


def _case_twin(columns: Any, declared: dict[str, str]) -> str | None:
    """A column that differs from a declared one only by case (Delta names are case-insensitive)."""
    for column in columns:
        twin = declared.get(column.lower())
        if twin is not None and twin != column:
            return f"column {column!r} differs from column {twin!r} only by case"
    return None


class _Screen:
    """What is known of one column-type map: its plain-value screen and its names, lower-cased."""

    def __init__(self, types: dict[str, str]) -> None:
        self.types = types  # held, so that its id is not reused during the batch
        self.columns = _screen(types)
        self.lowered = {name.lower(): name for name in types}
        twins = len(self.lowered) != len(types)
        self.broken = "the record declares columns that differ only by case" if twins else None


class TypedRows:
    """The row images of one batch's typed records, checked against their declared types."""

    def __init__(self) -> None:
        self._screens: dict[int, _Screen] = {}
        self._found: dict[int, str] = {}
        # id(types) -> (types, [(record index, row images, the columns the screen left unsure)]); the map
        # is held, so its id is not reused
        self._unsure: dict[int, tuple[dict[str, str], list[tuple[int, list[dict], set[str]]]]] = {}
        self._what: dict[int, str] = {}  # id(types) -> the reason's first words

    def add(self, index: int, images: list[dict], types: dict[str, str], what: str = _MISFIT) -> None:
        """The row images of record `index`, checked against `types`: the types it declares or, for a
        record that declares none, those of its range (`what`: BARE_MISFIT)."""
        self._what.setdefault(id(types), what)
        screen = self._screens.get(id(types))
        if screen is None:
            screen = self._screens[id(types)] = _Screen(types)
        unsure: set[str] = set()
        for image in images:
            undeclared = image.keys() - types.keys()
            reason = screen.broken or (_case_twin(undeclared, screen.lowered) if undeclared else None)
            if reason is not None:
                self._found[index] = f"{what}: {reason}"
                return
            unsure.update(_unsure(image, screen.columns))
        if unsure:
            self._unsure.setdefault(id(types), (types, []))[1].append((index, images, unsure))

    def misfits(self) -> dict[int, str]:
        """Record index -> why its rows do not fit the column types it declares.

        Only the columns the screen left unsure are converted: a vouched-for value always converts, so
        the first column that fails, and the reason, are those of a conversion of every column."""
        found = dict(self._found)
        for types, records in self._unsure.values():
            columns = set().union(*(unsure for _, _, unsure in records))
            checked = {name: type_name for name, type_name in types.items() if name in columns}
            if misfit([image for _, images, _ in records for image in images], checked) is None:
                continue
            for index, images, unsure in records:
                reason = misfit(images, {name: checked[name] for name in checked if name in unsure})
                if reason is not None:
                    found[index] = f"{self._what[id(types)]}: {reason}"
        return found
