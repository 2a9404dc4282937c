"""The parse of one schema version's JSON values of a chunk (`VersionParse`, a part of
`debezium_columns.RangeColumns`): the values of one wrapper layout group (`wrapper_layouts`) are screened,
then parsed together by `pyarrow.json` into typed columns, the row images' types each Connect schema
block's, else inferred by Arrow over the range (and kept for its next batches).

Odd records found here (left to the record-by-record way): a value that is not one JSON object, holds a
raw line break or nests deeper than `MAX_NESTING`, or is not UTF-8 throughout; one `pyarrow.json` refuses
(invalid JSON, a duplicate name, a value of another type than its column's), found by the row its error
names; where the envelope's fields are cut out before the parse (below), one that is not a JSON document
by RFC 8259 (`NaN`, a lone surrogate).

What sends the whole range back (`NotVectorisable`) here: declared types other than integers, floats,
booleans, text, dates and integer-coded millisecond/microsecond timestamps; a row column no schema declares
next to declared ones whose types are not all known (a map, an array of structs: then the other fields are
inferred; where every declared column has its type, an undeclared key is dropped, as the reference and
Kafka Connect drop it, and the envelope's other fields are not built: elsewhere, with the images'
columns inferred, the op and image fields are cut out of each value first, `formats.envelope_fields`);
nested inferred columns; integers of 19 digits or more in the range where a column inferred as float holds
a value that large (the envelope's `ts_ns` alone does not); a column the two images type differently; more
than `_MAX_REFUSED` records refused by `pyarrow.json` in one batch.

Decided difference: a schema-less column whose surviving values were all written as integers, in a range
where other records wrote it with a fraction, is float64 here (Arrow parses the range's values as one
column) and int64 the record-by-record way.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from connectors.delta.arrow_types import one_array
from service.kafka_to_delta.formats.bulk_values import is_utf8, json_lines, parse_type
from service.kafka_to_delta.formats.debezium_json import MAX_NESTING
from service.kafka_to_delta.formats.envelope_fields import kept_fields
from service.kafka_to_delta.source.range_state import _INFERRED_KINDS, RangeState, _mask, _shown
from service.kafka_to_delta.source.vector_plan import NotVectorisable
from service.kafka_to_delta.source.wrapper_layouts import BARE

_ERROR_ROW = re.compile(r" in row (\d+)$")
_MAX_REFUSED = 8
_LONG_NUMBER = r"[0-9]{19}"
_OPEN_BRACE, _OPEN_BRACKET, _NEWLINE, _RETURN = (ord(c) for c in "{[\n\r")
_LONG_DIGIT_RUN = b"0" * 19
_DIGITS_TO_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_NINETEEN_DIGITS = 1e18


class VersionParse(RangeState):
    """The screening and parse of one schema version's payloads, and the types learned from them."""

    @staticmethod
    def _screened(payloads: pa.Array) -> np.ndarray:
        """Payloads that may be parsed in bulk: one JSON object, no raw line break (inside a JSON
        string one is invalid, between tokens it would split the line), no deeper nesting than the
        record-by-record way accepts."""
        whole = _mask(pc.and_(pc.starts_with(payloads, pattern="{"), pc.ends_with(payloads, pattern="}")))
        payloads = one_array(payloads)
        offsets = np.frombuffer(payloads.buffers()[1], np.int32)[payloads.offset:payloads.offset + len(payloads) + 1]
        if not len(payloads) or offsets[-1] == offsets[0]:
            return whole
        data = np.frombuffer(payloads.buffers()[2], np.uint8)[offsets[0]:offsets[-1]]
        ends = (offsets[1:] - offsets[0]).astype(np.int64)

        def per_value(hits: np.ndarray) -> np.ndarray:  # hits: positions in `data`
            return np.bincount(np.searchsorted(ends, hits, side="right"), minlength=len(ends))[:len(ends)]

        brackets = per_value(np.flatnonzero((data == _OPEN_BRACE) | (data == _OPEN_BRACKET)))
        breaks = per_value(np.flatnonzero((data == _NEWLINE) | (data == _RETURN)))
        return whole & (brackets <= MAX_NESTING) & (breaks == 0) & _utf8(payloads)

    def _explicit(self, group: int) -> tuple[pa.Schema, str]:
        """The parse schema of a group: its declared row types (or the range's known inferred
        ones); and what `pyarrow.json` does with the other fields: "ignore" where every column is
        declared with its type (what the reference reads of such a record: `changelog.declared_image`;
        the envelope's other fields, `source` first, are not built), else "infer"."""
        complete = False
        if group == BARE:
            types = dict(self.bare_types)
        else:
            layout = self._layout(group)
            parsed = {name: layout.nested[name] if name in layout.nested else parse_type(type_name)
                      for name, type_name in layout.types.items()}
            types = {name: data_type for name, data_type in parsed.items() if data_type is not None}
            complete = len(types) == len(parsed)
            if len({name.lower() for name in layout.types}) != len(layout.types):
                raise NotVectorisable("declared columns differ only by case")
        types.update(self.nested_types.get(group, {}))
        row = pa.struct([pa.field(name, data_type) for name, data_type in types.items()])
        schema = pa.schema([(self.plan.op, pa.string()), (self.plan.before, row), (self.plan.after, row)])
        return schema, "ignore" if complete and not self.reads_envelope else "infer"

    def _parse(self, group: int, payloads: pa.Array, members: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        """The parsed payloads at `members`, and the members parsed (a record `pyarrow.json`
        refuses, found by the row its error names, is left out)."""
        schema, others = self._explicit(group)
        for _ in range(_MAX_REFUSED + 1):
            if not len(members):
                return schema.empty_table(), members
            chosen = payloads.take(pa.array(members))
            if others == "infer" and not self.reads_envelope:  # the envelope's other fields would be built
                buffer, refused = kept_fields(chosen, (self.plan.op, self.plan.before, self.plan.after))
                members = members[~refused]
                if not len(members):
                    continue
            else:
                buffer = json_lines(chosen)
            try:
                table = pj.read_json(
                    pa.py_buffer(buffer), read_options=pj.ReadOptions(use_threads=False, block_size=len(buffer) + 1),
                    parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior=others),
                )
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                row = _ERROR_ROW.search(str(exc))
                if row is not None and int(row.group(1)) < len(members):
                    members = np.delete(members, int(row.group(1)))
                    continue
                parsed = pa.array(buffer.split(b"\n")[:-1], pa.binary())
                long_numbers = _mask(pc.match_substring_regex(parsed, _LONG_NUMBER))
                if not long_numbers.any():  # a conversion error names no row: integers beyond 64 bits
                    raise NotVectorisable(f"pyarrow.json refused the values ({_shown(exc)})") from None
                members = members[~long_numbers]
                continue
            if table.num_rows != len(members):
                raise NotVectorisable("a value holds more than one JSON document")
            if not _valid_lists(table):  # parse those columns again with the types Arrow inferred
                fixed = self.nested_types.setdefault(group, {})
                inferred = _nested_types(table, (self.plan.before, self.plan.after))
                if not inferred.keys() - fixed.keys():
                    raise NotVectorisable("pyarrow.json built an invalid list column")
                fixed.update(inferred)
                self.order.update(dict.fromkeys(child.name for side in (self.plan.before, self.plan.after)
                                                for child in table.schema.field(side).type))  # as first seen
                schema, others = self._explicit(group)
                continue
            if self._learn(table, buffer, group):  # text Arrow took for timestamps: parse it as text
                schema, others = self._explicit(group)
                continue
            return table, members
        raise NotVectorisable(f"pyarrow.json refused more than {_MAX_REFUSED} values of one batch")

    def _learn(self, table: pa.Table, buffer: bytes, group: int) -> list[str]:
        """Check the images' inferred columns and adopt their types for the range's next batches;
        the schema-less columns Arrow took for timestamps (to be parsed again as text)."""
        types: dict[str, pa.DataType] = {}
        for side in (self.plan.before, self.plan.after):
            for child in table.schema.field(side).type:
                # text Arrow took for a time is parsed again as text
                kind = pa.string() if pa.types.is_timestamp(child.type) and group == BARE else child.type
                known = types.setdefault(child.name, kind)
                if known != kind and pa.types.is_null(known):
                    types[child.name] = kind
                    continue
                if (known != kind and not pa.types.is_null(kind)
                        and not (pa.types.is_nested(known) and pa.types.is_nested(kind))):
                    raise NotVectorisable(f"column {child.name!r} typed differently in the two images")
        if group != BARE:
            if types.keys() - self._layout(group).types.keys():
                raise NotVectorisable("a row column no schema declares next to declared ones")
            return []
        inferred = {name: data_type for name, data_type in types.items() if name not in self.bare_types}
        timestamps = [name for name in inferred if any(
            pa.types.is_timestamp(table.schema.field(side).type.field(name).type)
            for side in (self.plan.before, self.plan.after)
            if table.schema.field(side).type.get_field_index(name) >= 0)]
        for name, data_type in inferred.items():
            if (not pa.types.is_null(data_type) and data_type not in _INFERRED_KINDS
                    and not pa.types.is_nested(data_type) and name not in timestamps):
                raise NotVectorisable(f"column {name!r} is inferred as {data_type}")
            if (pa.types.is_floating(data_type) and self._reaches_19_digits(table, name)
                    and _LONG_DIGIT_RUN in buffer.translate(_DIGITS_TO_ZERO)):
                raise NotVectorisable("integers of 19 digits or more may sit in a float column")
        self.bare_types.update({n: pa.string() if n in timestamps else t for n, t in inferred.items()
                                if not pa.types.is_null(t) and not pa.types.is_nested(t)})
        return timestamps

    def _reaches_19_digits(self, table: pa.Table, name: str) -> bool:
        """Whether an image's float column `name` holds a value of 19 integer digits or more (only
        then can a long digit run of the values be one of its values, and not e.g. the envelope's
        `ts_ns`)."""
        for side in (self.plan.before, self.plan.after):
            image = table.column(side).combine_chunks()
            if image.type.get_field_index(name) < 0:
                continue
            largest = pc.max(pc.abs(image.field(name))).as_py()
            if largest is not None and largest >= _NINETEEN_DIGITS:
                return True
        return False


def _utf8(payloads: pa.Array) -> np.ndarray:
    """Values that are UTF-8 throughout (the reference decodes a whole value as text first; neither
    `pyarrow.json` nor `envelope_fields` checks the fields it does not build)."""
    try:
        payloads.view(pa.string()).validate(full=True)
        return np.ones(len(payloads), np.bool_)
    except pa.ArrowInvalid:  # rare: find them one by one
        return np.array([value is None or is_utf8(value) for value in payloads.to_pylist()], np.bool_)


def _valid_lists(table: pa.Table) -> bool:
    """False where `pyarrow.json` (26) built an invalid list array: it can when it infers a list
    whose items it first saw as nulls; the same values parse correctly with the type given."""
    if not any(_has_list(field.type) for field in table.schema):
        return True
    try:
        table.validate()
    except pa.ArrowInvalid:
        return False
    return True


def _nested_types(table: pa.Table, sides: tuple[str, ...]) -> dict[str, pa.DataType]:
    """The row columns Arrow inferred as lists or structs, with null item types made text."""
    types: dict[str, pa.DataType] = {}
    for side in sides:
        for child in table.schema.field(side).type:
            if _has_list(child.type):
                types[child.name] = _without_null(child.type)
    return types


def _without_null(data_type: pa.DataType) -> pa.DataType:
    if pa.types.is_null(data_type):
        return pa.string()
    if pa.types.is_list(data_type):
        return pa.list_(_without_null(data_type.value_type))
    if pa.types.is_struct(data_type):
        return pa.struct([pa.field(f.name, _without_null(f.type)) for f in data_type])
    return data_type


def _has_list(data_type: pa.DataType) -> bool:
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return True
    return pa.types.is_struct(data_type) and any(_has_list(f.type) for f in data_type)
