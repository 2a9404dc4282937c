"""Vectorised decode of one Kafka range of Debezium envelopes (JSON, or Confluent-framed Avro),
straight to typed net changes.

The plain path's fast way (`partition_changes.PartitionReducer`): instead of parsing, converting
and re-encoding record by record, a batch's values are parsed together by `pyarrow.json` into
typed columns (the row images' types: each Connect schema block's, else inferred by Arrow over
the range), their changelog rows are built as Arrow columns and reduced to the last change per
primary key with a group-by. The values are sorted by their wrapper's bytes first
(`wrapper_layouts`): each schema version of the range is parsed with its own types, and any
JSON layout a producer writes consistently (spaces, key order) is cut open in Arrow.

It produces what the record-by-record way does (`typed_changes` of the reduced rows) for every
record it vouches for. A record it cannot vouch for is an odd record (`RangeColumns.odd`): the
caller decodes those alone the record-by-record way, which decides errors, policies and dead
letters, and merges the two by key in source order. Odd records: a value whose wrapper layout
cannot be confirmed, that is not one JSON object, holds a raw line break or nests deeper than
`MAX_NESTING`, or is not UTF-8 throughout; one `pyarrow.json` refuses (invalid JSON, a duplicate
name, a value of another type than its column's), found by the row its error names; where the
envelope's fields are cut out before the parse (below), one that is not a JSON document by RFC 8259
(`NaN`, a lone surrogate); an unknown or missing op code
(truncates and messages included); an image missing where the op needs it; a primary key
missing, null, a placeholder or text that JSON escapes; a declared integer out of its type's
range. Debezium's unavailable-value placeholder (a TOASTed column left unchanged) is taken in
bulk: the column is filled from the key's latest earlier image of the range holding it, else
left to the sink (`unchanged`). A delete ends the key's images: a placeholder after it, with no
image since, stands for null (the row it would keep is gone), as across batches and ranges.

Confluent Avro values (the value decoder is `ConfluentAvroDecoder`) are decoded per schema id by
`connectors.schema_registry.avro_columns` (Arrow's Rust Avro reader, typed columns); each schema
id is a group with its codec's column types and goes through the same changelog, key and
reduction steps. Odd records there: what the bulk reader cannot vouch for (a frame or schema id
it does not take, a body that does not end where the record does, a union index outside its
union, invalid UTF-8, a value its column type does not take), besides the op, image and key
checks above. Non-finite doubles become null, as the reference's JSON rows make them.

What still sends the whole range back (`NotVectorisable`): settings other than envelopes with an
op field and plain op groupings; declared types other than integers, floats, booleans, text,
dates and integer-coded millisecond/microsecond timestamps; a row column no schema declares next
to declared ones whose types are not all known (a map, an array of structs: then the other fields are
inferred; where every declared column has its type, an undeclared key is dropped, as the reference and
Kafka Connect drop it, and the envelope's other fields are not built: elsewhere, with the images'
columns inferred, the op and image fields are cut out of each value first, `formats.envelope_fields`);
nested inferred columns; integers
of 19 digits or more in the range where a column inferred as float holds a value that large (the
envelope's `ts_ns` alone does not); key values other than integers, booleans and text; a column typed
differently by two images or schema versions in a way Arrow cannot unify; more than
`_MAX_REFUSED` records refused by `pyarrow.json` in one batch; a key with changes among both
the odd records and the others next to placeholders (the fill would have to cross the two ways).

Decided differences: a schema-less column whose surviving values were all written as integers,
in a range where other records wrote it with a fraction, is float64 here (Arrow parses the
range's values as one column) and int64 the record-by-record way. A schema-less image with a
column absent (not null) counts as holding null for the placeholder fill, as does an image whose
schema version lacks the column. Columns without a declared type follow the first record of the
range that names them here, the first surviving change that does record by record (a column added
by DDL may come first there); the sink matches columns by name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import repeat
from operator import is_not
from typing import Any, ClassVar, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from connectors.delta.arrow_types import PLAIN_TEXT, TypeName, arrow_type, merge_types, one_array
from connectors.kafka.range_reader import ValueChunk
from service.config.op_mapping import Grouping, parse_op_mapping
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder
from service.kafka_to_delta.formats.bulk_values import (
    bulk_column,
    is_utf8,
    json_lines,
    json_text,
    parse_type,
)
from service.kafka_to_delta.formats.debezium_json import (
    MAX_NESTING,
    UNAVAILABLE_VALUE,
    JsonDocuments,
)
from service.kafka_to_delta.formats.envelope_fields import kept_fields
from service.kafka_to_delta.formats.row_text import row_texts, unchanged_texts
from service.kafka_to_delta.materialize.last_change import last_rows
from service.kafka_to_delta.rows.arrow import joined_tables
from service.kafka_to_delta.rows.names import TYPED_IMAGE, TYPED_PREFIX, Column, typed_names
from service.kafka_to_delta.source.wrapper_layouts import BARE, ODD, Layout, Layouts
from vocabulary.changes import ChangeKind

_META = ("__vec_key", "__vec_retract", "__vec_group", "__vec_image", "__vec_topic", "__vec_partition",
         "__vec_offset", "__vec_change_index", "__vec_timestamp", "__vec_unchanged")
_KEY, _RETRACT, _GROUP, _IMAGE, _TOPIC, _PARTITION, _OFFSET, _CHANGE_INDEX, _TIMESTAMP, _UNCHANGED = _META
GROUP_COLUMN, KEY_COLUMN = _GROUP, _KEY
"""The net rows' schema version (a `Layouts` index, or `wrapper_layouts.BARE`)."""
SOURCE_COLUMNS = {Column.TOPIC: _TOPIC, Column.PARTITION: _PARTITION, Column.OFFSET: _OFFSET,
                  Column.CHANGE_INDEX: _CHANGE_INDEX, Column.TIMESTAMP: _TIMESTAMP}
"""A changelog row's source columns -> the columns holding them here."""
TEXT_COLUMNS = ("__vec_row_text", "__vec_kind", "__vec_unchanged_text")
ROW_TEXT, KIND, UNCHANGED_TEXT = TEXT_COLUMNS
"""The columns `RangeColumns.with_texts` adds to each changelog row."""
_FLAG = "__vec_kept__"
"""Prefix of the per-column flag of a value left unchanged (the placeholder)."""
_RECORD = "__record"
_INFERRED_KINDS = {pa.int64(): TypeName.INT64, pa.float64(): TypeName.FLOAT64, pa.bool_(): TypeName.BOOL,
                   pa.string(): TypeName.STRING}
_KEY_TYPES = (pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.bool_(), pa.string())
_ERROR_COLUMN = re.compile(r"Column\((/[^)]*)\)")
_ERROR_ROW = re.compile(r" in row (\d+)$")
_MAX_REFUSED = 8
_LONG_NUMBER = r"[0-9]{19}"
_OPEN_BRACE, _OPEN_BRACKET, _NEWLINE, _RETURN = (ord(c) for c in "{[\n\r")
_LONG_DIGIT_RUN = b"0" * 19
_DIGITS_TO_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_NINETEEN_DIGITS = 1e18
_UNAVAILABLE = UNAVAILABLE_VALUE.encode()
_REDUCE_ROWS = 20_000
"""Changelog rows of a range's chunks reduced together at least (`RangeColumns.reduced`)."""
_US_PER_MS = 1_000  # timestamp_ms columns are stored in microseconds
_RETRACTING = (Grouping.UPDATE_BEFORE, Grouping.DELETE)
_STATELESS = (Grouping.INSERT, Grouping.UPDATE_AFTER, Grouping.UPSERT, Grouping.UPDATE, *_RETRACTING)


class NotVectorisable(Exception):
    """The range holds something only the record-by-record way decides; the reason says what."""


@dataclass(frozen=True)
class _Side:
    """What an op code takes from one image: whether it is a retraction, whether it is optional,
    whether it is an image (a delete's is not: it never fills a later placeholder)."""

    retract: bool
    optional: bool = False
    image: bool = True
    nulls_unchanged: bool = False
    """Its nulls are unchanged markers (`ignore_null_updates`, an update's image)."""
    kind: str = ""
    """The change kind of its rows (`ChangeKind`'s text)."""


@dataclass(frozen=True)
class VectorPlan:
    """The envelope fields and, per op code, the images it emits (before side, after side)."""

    op: str
    before: str
    after: str
    codes: dict[str, tuple[_Side | None, _Side | None]]
    primary_key: tuple[str, ...]


def vector_plan(decoder: ChangelogBatchDecoder, primary_key: tuple[str, ...]) -> VectorPlan | None:
    """The plan for a decoder's records, or None when its settings are not this path's."""
    settings = decoder.settings
    if isinstance(decoder.decode_value, JsonDocuments):
        if decoder.decode_value.layout.passthrough:
            return None
    elif not is_avro(decoder.decode_value):
        return None
    if (settings.op is None or settings.before is None or settings.after is None or settings.before == settings.after
            or settings.stateful or settings.order_by is not None or settings.sequence_by or settings.passthrough
            or settings.kafka_key != "fallback"):
        return None
    stage = decoder.stage
    if stage.upsert_key != stage.primary_key or stage.partition_by != stage.primary_key:
        return None
    codes: dict[str, tuple[_Side | None, _Side | None]] = {}
    for code, grouping in parse_op_mapping(settings.op_mapping).items():
        if grouping not in _STATELESS:
            return None
        nulls = stage.ignore_null_updates and grouping not in (Grouping.INSERT, Grouping.DELETE)
        if grouping in _RETRACTING:
            kind = ChangeKind.UPDATE_BEFORE if grouping is Grouping.UPDATE_BEFORE else ChangeKind.DELETE
            codes[code] = (_Side(retract=True, image=grouping is Grouping.UPDATE_BEFORE, nulls_unchanged=nulls,
                                 kind=kind.value), None)
        elif grouping is Grouping.UPDATE:
            codes[code] = (_Side(retract=True, optional=True, nulls_unchanged=nulls, kind=ChangeKind.UPDATE_BEFORE.value),
                           _Side(retract=False, nulls_unchanged=nulls, kind=ChangeKind.UPDATE_AFTER.value))
        else:
            kind = ChangeKind.INSERT if grouping is Grouping.INSERT else ChangeKind.UPDATE_AFTER
            codes[code] = (None, _Side(retract=False, nulls_unchanged=nulls, kind=kind.value))
    return VectorPlan(settings.op, settings.before, settings.after, codes, tuple(primary_key))


def _utf8(payloads: pa.Array) -> np.ndarray:
    """Values that are UTF-8 throughout (the reference decodes a whole value as text first; neither
    `pyarrow.json` nor `envelope_fields` checks the fields it does not build)."""
    try:
        payloads.view(pa.string()).validate(full=True)
        return np.ones(len(payloads), np.bool_)
    except pa.ArrowInvalid:  # rare: find them one by one
        return np.array([value is None or is_utf8(value) for value in payloads.to_pylist()], np.bool_)


def _mask(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean Arrow array as numpy, nulls as False."""
    return np.asarray(pc.fill_null(array, False).to_numpy(zero_copy_only=False), np.bool_)


@dataclass
class RangeColumns:
    """The net changes of one range's batches, decoded and reduced in Arrow."""

    plan: VectorPlan
    documents: JsonDocuments | Any
    """The value decoder: JSON documents, or the Confluent Avro decoder."""
    changes: int = 0
    topic: str | None = None
    partition: int | None = None
    layouts: Layouts | None = None
    bare_types: dict[str, pa.DataType] = field(default_factory=dict)
    """Columns of schema-less documents of known type (parsed as such in later batches)."""
    order: dict[str, None] = field(default_factory=dict)
    """Every row column, in order of first appearance (null-typed ones included)."""
    net: pa.Table | None = None
    """The last change per key of the chunks reduced so far (`reduced` folds in those added since)."""
    odd: list[int] = field(default_factory=list)
    """Offsets of the records left to the record-by-record way."""
    avro: Any = None
    """The bulk Avro decoder (`avro_columns.BulkAvroDecoder`) when the values are Confluent Avro."""
    _avro_groups: dict[int, int] = field(default_factory=dict)
    typed_groups: set[int] = field(default_factory=set)
    """Groups whose columns arrive typed (Avro): no JSON value checks."""
    nested_types: dict[int, dict[str, pa.DataType]] = field(default_factory=dict)
    """Per group: nested columns parsed with the type Arrow inferred for them (`_valid_lists`)."""
    held: dict[str, pa.Table] = field(default_factory=dict)
    """Per column a placeholder stood for: the key's latest image value of the range holding it,
    null where a delete came after it (`_track_placeholders`), once `_held_pending` is folded in."""
    with_texts: bool = False
    """Whether each changelog row also carries its image as the text the record-by-record way writes
    (`ROW_TEXT`, from the values in the reference document's form), its change kind (`KIND`) and its
    unchanged columns (`UNCHANGED_TEXT`): the decode stage's rows (`changelog_columns`)."""
    with_typed: bool = False
    """With `with_texts`: each changelog row of a record declaring its columns (Avro, JSON with a schema block)
    also carries its image's columns typed as the row's declared types type them (`TYPED_PREFIX` columns,
    `TYPED_IMAGE` where they hold the image)."""
    _pending: list[pa.Table] = field(default_factory=list)
    """Changelog rows of chunks added since the last `reduced`."""
    _held_pending: dict[str, list[pa.Table]] = field(default_factory=dict)
    reads_envelope: ClassVar[bool] = False
    """Whether the changelog rows take envelope fields besides the op and the images (then they are parsed)."""

    def __post_init__(self) -> None:
        if isinstance(self.documents, JsonDocuments):
            if self.layouts is None:
                self.layouts = Layouts(self.documents)
            return
        from connectors.schema_registry.avro_columns import BulkAvroDecoder

        self.avro = BulkAvroDecoder(self.documents)
        self.layouts = Layouts(JsonDocuments())  # holds a layout per schema id (`_avro_parts`)

    def add(self, chunk: ValueChunk) -> None:
        """Decode and fold in one chunk of the range's records; raises `NotVectorisable`."""
        rows = self.changelog_rows(chunk)
        if rows is None:
            return
        self.changes += rows.num_rows
        self._track_placeholders(rows)
        self._pending.append(rows)
        if _due(self._pending, self.net):
            self.reduced()

    def changelog_rows(self, chunk: ValueChunk) -> pa.Table | None:
        """The changelog rows of one chunk's records decoded here, in source order, with their source
        columns (None: none); the odd records' offsets go to `odd`. Raises `NotVectorisable`."""
        assert self.layouts is not None
        self.topic, self.partition = chunk.topic, chunk.partition
        parts, odd = self._avro_parts(chunk) if self.avro is not None else self._json_parts(chunk)
        offsets = pa.array(chunk.offsets, pa.int64())
        self.odd.extend(offsets.take(pa.array(odd, pa.int64())).to_pylist())
        if not parts:
            return None
        try:
            rows = joined_tables(parts, "permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise NotVectorisable(f"schema versions typed a column differently ({_shown(exc)})") from None
        rows = rows.take(pc.sort_indices(rows, [(_RECORD, "ascending"), (_CHANGE_INDEX, "ascending")]))
        source = rows.column(_RECORD)
        rows = rows.drop_columns([_RECORD])
        rows = rows.append_column(_TOPIC, pa.array([chunk.topic] * rows.num_rows, pa.string()))
        rows = rows.append_column(_PARTITION, pa.array(np.full(rows.num_rows, chunk.partition, np.int32))
                                  if chunk.partitions is None else pa.array(chunk.partitions, pa.int32()).take(source))
        rows = rows.append_column(_OFFSET, offsets.take(source))
        rows = rows.append_column(_TIMESTAMP, pa.array(chunk.timestamps, pa.int64()).take(source))
        return self._conformed(rows)

    def reduced(self) -> pa.Table | None:
        """The last change per key of every chunk added so far (`net`): the chunks waiting are folded in.

        Chunks wait until they hold as many rows as the net rows (and at least `_REDUCE_ROWS`), so that
        each reduction's copy of the wide net rows is paid for by as many new rows: folding in every
        chunk copied the whole net rows again per chunk (quadratic in a range of many keys)."""
        if self._pending:
            self.net = _last_of([self.net, *self._pending] if self.net is not None else self._pending,
                                "batches of the range typed a column differently")
            self._pending = []
        return self.net

    def _json_parts(self, chunk: ValueChunk) -> tuple[list[pa.Table], np.ndarray]:
        """(changelog rows of the chunk's JSON values per schema version, `__record` their position
        in the chunk; positions of the odd records)."""
        assert self.layouts is not None
        values = chunk.values
        positions = np.flatnonzero(np.fromiter(map(is_not, values, repeat(None)), np.bool_, len(values)))
        if not len(positions):  # tombstones, which follow a delete, give nothing
            return [], np.zeros(0, np.int64)
        present = values if len(positions) == len(values) else [values[i] for i in positions.tolist()]
        groups, payloads = self.layouts.split(cast(list[bytes], present))
        odd = groups == ODD
        if self.with_texts:
            # A schema-less image's text is the record's own key order and spelling, which columns cannot
            # show (a key left out, keys in another order): such records go record by record, and a range
            # of them all the record-by-record way.
            bare = groups == BARE
            if bare.all():
                raise NotVectorisable("schema-less JSON values (their texts are the records' own spelling)")
            odd |= bare
        parts = []
        for group in np.unique(groups[~odd]):
            members = np.flatnonzero(groups == group)
            chosen = payloads if len(members) == len(payloads) else [payloads[member] for member in members]
            rows, refused = self._group_changes(int(group), pa.array(chosen, pa.binary()))
            odd[members[refused]] = True
            if rows.num_rows:
                parts.append(rows.set_column(rows.schema.get_field_index(_RECORD), _RECORD,
                                             pa.array(positions[members]).take(rows.column(_RECORD))))
        return parts, positions[odd]

    def _avro_parts(self, chunk: ValueChunk) -> tuple[list[pa.Table], np.ndarray]:
        """The same for Confluent-framed Avro values, decoded per schema id by `avro_columns`."""
        assert self.avro is not None and self.layouts is not None
        decoded = self.avro.decode(chunk.values, json_forms=self.with_texts)
        odd = list(decoded.fallback)
        parts = []
        for schema_id, columns in decoded.groups.items():
            if not columns.is_envelope:
                raise NotVectorisable("Avro records that are not change envelopes")
            group = self._avro_groups.get(schema_id)
            if group is None:
                group = len(self.layouts.known)
                self.layouts.known.append(Layout(b"", b"", dict(columns.column_types), {}))
                self._avro_groups[schema_id] = group
                self.typed_groups.add(group)
            if {self.plan.op, self.plan.before, self.plan.after} - set(columns.table.column_names):
                raise NotVectorisable("Avro envelopes without the configured op and image fields")
            table, typed = columns.table, None
            if self.with_texts:
                if columns.json_form is None:
                    raise NotVectorisable("Avro columns whose document form needs a conversion")
                table, typed = columns.json_form, columns.table if self.with_typed else None
            rows, kept = self._changelog(table, group, typed)
            indices = np.asarray(columns.indices, np.int64)
            odd.extend(indices[~kept].tolist())
            if rows.num_rows:
                parts.append(rows.set_column(rows.schema.get_field_index(_RECORD), _RECORD,
                                             pa.array(indices).take(rows.column(_RECORD))))
        return parts, np.asarray(sorted(odd), np.int64)

    # -- one schema version of a chunk --------------------------------------------------------------

    def _group_changes(self, group: int, payloads: pa.Array) -> tuple[pa.Table, np.ndarray]:
        """(changelog rows of one group's payloads, with `__record` their position in `payloads`;
        positions of the payloads left to the record-by-record way)."""
        accepted = self._screened(payloads)
        members = np.flatnonzero(accepted)
        parsed, members = self._parse(group, payloads, members)
        rows, kept = self._changelog(parsed, group, parsed if self.with_typed and group != BARE else None)
        keep = np.zeros(len(payloads), np.bool_)
        keep[members[kept]] = True
        if rows.num_rows:
            rows = rows.set_column(rows.schema.get_field_index(_RECORD), _RECORD,
                                   pa.array(members).take(rows.column(_RECORD)))
        return rows, np.flatnonzero(~keep)

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

    def _layout(self, group: int) -> Layout:
        assert self.layouts is not None
        return self.layouts.known[group]

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

    def _changelog(self, parsed: pa.Table, group: int, typed: pa.Table | None = None) -> tuple[pa.Table, np.ndarray]:
        """(changelog rows of the parsed records in source order (record, change index), with
        `__record` the parsed row; the parsed rows kept: the others are left to the
        record-by-record way). `typed`: the same records' typed columns (`with_typed`)."""
        op = parsed.column(self.plan.op)
        keep = _mask(pc.is_in(op, pa.array(list(self.plan.codes), pa.string())))
        sides = []
        for position, side_name in enumerate((self.plan.before, self.plan.after)):
            image = parsed.column(side_name).combine_chunks()
            valid = _mask(image.is_valid())
            emits = np.zeros(len(op), np.bool_)
            nulls = np.zeros(len(op), np.bool_)
            for code, pair in self.plan.codes.items():
                side = pair[position]
                if side is None:
                    continue
                coded = _mask(pc.equal(op, code))
                if not side.optional:
                    keep &= ~coded | valid
                emits |= coded & valid
                if side.nulls_unchanged:
                    nulls |= coded & valid
            typed_image = typed.column(side_name).combine_chunks() if typed is not None else None
            rows, misfits = self._side_rows(image, group, nulls & keep, typed_image)
            keep &= ~(emits & (self._unkeyed(image) | misfits))
            sides.append((rows, emits))
        tables = []
        emitted_before = None
        for position, (rows, emits) in enumerate(sides):
            emits = emits & keep
            if position == 0:
                emitted_before = emits
            index = np.flatnonzero(emits)
            if not len(index):
                continue
            codes = op.take(pa.array(index))
            retract, is_image = self._flags(codes, position)
            change_index = (pa.array(emitted_before[index].astype(np.int32)) if position == 1 and emitted_before
                            is not None else pa.array(np.zeros(len(index), np.int32)))
            taken = (rows.take(pa.array(index)).append_column(_RETRACT, retract).append_column(_IMAGE, is_image)
                     .append_column(_GROUP, pa.array(np.full(len(index), group, np.int32)))
                     .append_column(_CHANGE_INDEX, change_index)
                     .append_column(_RECORD, pa.array(index)))
            if self.with_texts:
                taken = taken.append_column(KIND, self._kinds(codes, position))
            tables.append(taken)
        if not tables:
            return self._empty(), keep
        try:
            return pa.concat_tables(tables, promote_options="default"), keep
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise NotVectorisable(f"the two images typed a column differently ({_shown(exc)})") from None

    def _side_rows(self, image: pa.StructArray, group: int, nulls: np.ndarray,
                   typed_image: pa.StructArray | None = None) -> tuple[pa.Table, np.ndarray]:
        """(one side's images as rows: the key text, the columns as parsed (nested ones as JSON
        text), a `_FLAG` column per column holding the unavailable-value placeholder (its value
        null) or, in the images at `nulls` (`ignore_null_updates`), a null outside the primary key;
        the images holding a value only the record-by-record way can judge: one their declared
        type does not take (`bulk_values`)). With `with_texts`, the rows are the key text and the texts
        alone: they stand for the values; with `typed_image` (the same images as typed columns), also
        the typed image columns (`_typed_columns`)."""
        layout = self._layout(group) if group != BARE else None
        misfits = np.zeros(len(image), np.bool_)
        arrays, names, flags = [], [], []
        raw: list[tuple[pa.Array, np.ndarray]] = []  # each column as parsed, with the rows leaving it out
        for child, column in zip(image.type, image.flatten()):
            kept = np.zeros(len(image), np.bool_)
            raw.append((column, kept))
            if pa.types.is_string(column.type):
                kept = _mask(pc.equal(column, UNAVAILABLE_VALUE))
                if kept.any():
                    column = pc.if_else(pa.array(kept), pa.scalar(None, pa.string()), column)
            if nulls.any() and child.name not in self.plan.primary_key:
                absent = nulls & ~_mask(column.is_valid())
                if group == BARE and absent.any():
                    raise NotVectorisable("schema-less update images holding nulls under ignore_null_updates "
                                          "(a column left out cannot be told from a null)")
                kept |= absent
            if kept.any():
                flags.append((_FLAG + child.name, kept))
                raw[-1] = (raw[-1][0], kept)
            if self.with_texts and group in self.typed_groups:
                continue  # typed values, written as the text (`row_texts`): nothing to judge
            if layout is not None and child.name in layout.nested:
                column, misfit = json_text(column, fixed_key_order=True)
                misfits |= misfit
            elif group in self.typed_groups and pa.types.is_floating(column.type):
                # the reference's rows travel as JSON text, where NaN and infinities become null
                column = pc.if_else(pc.is_finite(column), column, pa.scalar(None, column.type))
            elif layout is not None and group not in self.typed_groups:  # typed with the net rows
                misfits |= bulk_column(column, layout.types[child.name])[1]
            elif pa.types.is_nested(column.type):
                column, misfit = json_text(column)
                misfits |= misfit
            arrays.append(column)
            names.append(child.name)
        if self.with_texts:
            columns = [f.name for f in image.type]
            texts = row_texts(len(image), columns, [column for column, _ in raw], [kept for _, kept in raw])
            if texts is None:
                raise NotVectorisable("a row column of a type the changelog text does not take")
            omitted = unchanged_texts(len(image), columns, [kept for _, kept in raw])
            table = pa.table({_KEY: self._key_text(image), ROW_TEXT: texts, UNCHANGED_TEXT: omitted})
            if typed_image is not None:
                for name, array in self._typed_columns(typed_image, group, dict(zip(columns, raw))).items():
                    table = table.append_column(name, array)
            return table, misfits
        arrays.append(self._key_text(image))
        names.append(_KEY)
        for name, kept in flags:
            arrays.append(pa.array(kept))
            names.append(name)
        return pa.Table.from_arrays(arrays, names=names), misfits

    def _typed_columns(self, image: pa.StructArray, group: int,
                       raw: dict[str, tuple[pa.Array, np.ndarray]]) -> dict[str, pa.Array]:
        """One side's typed image columns (`TYPED_PREFIX`), as the plain path types them (`_side_rows` without
        texts, then `typed_net` with the group's declared types): a column left unchanged is null, a
        non-finite float null, nested values JSON text; and `TYPED_IMAGE`, false for an image holding a
        value only its text may type. Nothing where a column is not one the texts were written from, or
        its values do not convert to its declared type in bulk (the rows are then typed from their texts)."""
        types = self._layout(group).types
        typed: dict[str, pa.Array] = {}
        holds = np.ones(len(image), np.bool_)
        for child, column in zip(image.type, image.flatten()):
            if child.name not in raw or child.name not in types:
                return {}
            kept = raw[child.name][1]
            if kept.any():
                column = pc.if_else(pa.array(kept), pa.scalar(None, column.type), column)
            if pa.types.is_floating(column.type):
                column = pc.if_else(pc.is_finite(column), column, pa.scalar(None, column.type))
            elif pa.types.is_nested(column.type):
                column, misfit = json_text(column)
                holds &= ~misfit
            try:
                typed[TYPED_PREFIX + child.name] = _typed(column, types[child.name], arrow_type(types[child.name]))
            except NotVectorisable:
                return {}
        typed[TYPED_IMAGE] = pa.array(holds)
        return typed

    def _kinds(self, codes: pa.Array, position: int) -> pa.Array:
        """The change kind of each row emitted from side `position` for its op code."""
        sides = [(code, pair[position]) for code, pair in self.plan.codes.items() if pair[position] is not None]
        kinds = pa.array([side.kind for _, side in sides if side is not None], pa.string())
        return kinds.take(pc.index_in(codes, value_set=pa.array([code for code, _ in sides], pa.string())))

    def _flags(self, codes: pa.Array, position: int) -> tuple[pa.Array, pa.Array]:
        """(retraction?, image?) of each row emitted from side `position` for its op code."""
        sides = [(code, pair[position]) for code, pair in self.plan.codes.items() if pair[position] is not None]
        retracting = [code for code, side in sides if side is not None and side.retract]
        images = [code for code, side in sides if side is not None and side.image]
        return (pc.is_in(codes, pa.array(retracting, pa.string())), pc.is_in(codes, pa.array(images, pa.string())))

    def _unkeyed(self, image: pa.StructArray) -> np.ndarray:
        """Images whose primary key the record-by-record way must judge: missing, null, the
        placeholder, or text that JSON escapes."""
        names = [f.name for f in image.type]
        bad = np.zeros(len(image), np.bool_)
        for column in self.plan.primary_key:
            if column not in names:
                return np.ones(len(image), np.bool_)
            values = pc.struct_field(image, column)
            if values.type not in _KEY_TYPES and not pa.types.is_null(values.type):
                raise NotVectorisable(f"primary key column {column!r} is {values.type}")
            bad |= ~_mask(values.is_valid())
            if values.type == pa.string():
                bad |= ~_mask(pc.match_substring_regex(values, PLAIN_TEXT))
                bad |= _mask(pc.equal(values, UNAVAILABLE_VALUE))
        return bad

    def _key_text(self, image: pa.StructArray) -> pa.Array:
        """The primary-key text of each image (`canonical_key` of the key values as written);
        meaningful where `_unkeyed` is False."""
        names = [f.name for f in image.type]
        if any(column not in names for column in self.plan.primary_key):
            return pa.nulls(len(image), pa.string())
        parts = []
        for column in self.plan.primary_key:
            values = pc.struct_field(image, column)
            if values.type == pa.string():
                parts.append(pc.binary_join_element_wise('"', values, '"', ""))
            elif values.type == pa.bool_():
                parts.append(pc.if_else(values, "true", "false"))
            else:
                parts.append(pc.cast(values, pa.string()))
        return pc.binary_join_element_wise("[", pc.binary_join_element_wise(*parts, ","), "]", "")

    def _conformed(self, rows: pa.Table) -> pa.Table:
        """Rows with the range's row columns in order of first appearance, flags after them."""
        self.order.update(dict.fromkeys(n for n in rows.column_names if n not in _META and n not in TEXT_COLUMNS
                                        and not n.startswith(_FLAG) and n not in typed_names([n])))
        names = [n for n in self.order if n in rows.column_names]
        return rows.select(names + [n for n in rows.column_names if n not in self.order])

    def _empty(self) -> pa.Table:
        fields = [pa.field(n, self.bare_types.get(n, pa.null())) for n in self.order]
        return pa.schema([*fields, (_KEY, pa.string()), (_RETRACT, pa.bool_()), (_IMAGE, pa.bool_()),
                          (_GROUP, pa.int32()), (_CHANGE_INDEX, pa.int32()), (_RECORD, pa.int64())]).empty_table()

    # -- placeholders -----------------------------------------------------------------------------

    @staticmethod
    def _holders(rows: pa.Table, name: str) -> pa.Table:
        """(key, value of `name`) of the image rows that hold it (all but those leaving it unchanged:
        an image whose schema version lacks the column holds null) and of the deletes (null: a delete
        ends the key's images), in source order."""
        image = _mask(rows.column(_IMAGE))
        deletes = _mask(rows.column(_RETRACT)) & ~image
        flag = _FLAG + name
        holds = image & ~_mask(rows.column(flag)) if flag in rows.column_names else image
        taken = pa.array(holds | deletes)
        if name not in rows.column_names:
            return pa.table({_KEY: rows.column(_KEY).filter(taken), name: pa.nulls(int(np.sum(holds | deletes)))})
        values = pc.if_else(pa.array(deletes), pa.scalar(None, rows.schema.field(name).type), rows.column(name))
        return pa.table({_KEY: rows.column(_KEY), name: values}).filter(taken)

    def _track_placeholders(self, rows: pa.Table) -> None:
        """Keep, per column a placeholder stood for, each key's latest image value holding it."""
        flagged = [n[len(_FLAG):] for n in rows.column_names if n.startswith(_FLAG)]
        for name in flagged:
            if name in self.held:
                continue
            self.held[name] = pa.table({_KEY: pa.array([], pa.string()), name: pa.array([], pa.null())})
            net = self.reduced()
            if net is not None and net.num_rows:
                self.held[name] = self._holders(net, name)
        for name in self.held:
            candidates = self._holders(rows, name)
            if candidates.num_rows:
                waiting = self._held_pending.setdefault(name, [])
                waiting.append(candidates)
                if _due(waiting, self.held[name]):
                    self._held_reduced(name)

    def _held_reduced(self, name: str) -> pa.Table:
        """`held[name]` with the candidates waiting folded in (as `reduced` does for the net rows)."""
        waiting = self._held_pending.pop(name, [])
        if waiting:
            self.held[name] = _last_of([self.held[name], *waiting], "schema versions typed a column differently")
        return self.held[name]

    def _filled(self, net: pa.Table) -> pa.Table:
        """Net upserts with placeholder columns filled from the key's latest earlier image holding
        them, and `_UNCHANGED` (the JSON list of the columns still left to the sink)."""
        pieces = []
        upserts = ~_mask(net.column(_RETRACT))
        for name in [n for n in self.order if n in self.held]:
            held, flag = self._held_reduced(name), _FLAG + name
            if flag not in net.column_names:
                continue
            kept = _mask(net.column(flag)) & upserts
            if kept.any():
                position = pc.index_in(net.column(_KEY), value_set=held.column(_KEY))
                found = kept & _mask(position.is_valid())
                if found.any():
                    values = held.column(name).take(position)
                    column = net.column(name)
                    if values.type != column.type:
                        try:
                            values = values.cast(column.type)
                        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                            raise NotVectorisable(f"column {name!r} filled across schema versions") from None
                    net = net.set_column(net.schema.get_field_index(name), name,
                                         pc.if_else(pa.array(found), values, column))
                kept &= ~found
            net = net.set_column(net.schema.get_field_index(flag), flag, pa.array(kept))
            pieces.append((name, kept))
        return net.append_column(_UNCHANGED, _unchanged_texts(net.num_rows, pieces))

    # -- the range's result -----------------------------------------------------------------------

    def result(self, primary_key: tuple[str, ...]) -> tuple[pa.Table | None, dict[str, str], dict[str, set[str]]]:
        """(net rows, declared types, seen kinds) as `typed_changes` gives them, before typing."""
        net = self.reduced()
        if net is None or net.num_rows == 0:
            return None, {}, {}
        net = self._filled(net)
        retract = net.column(_RETRACT)
        groups = net.column(_GROUP)
        declared: dict[str, str] = {}
        for group in pc.unique(groups).to_pylist():
            if group != BARE:
                declared = merge_types(declared, self._layout(group).types)
        upserts = pc.invert(retract)
        has_upserts = pc.any(upserts).as_py()
        bare = pc.equal(groups, BARE)
        seen: dict[str, set[str]] = {}
        inferring = pc.and_(bare, upserts) if has_upserts else bare  # the rows `typed_changes` infers from
        if pc.any(inferring).as_py():
            columns = [n for n in self.order if n in net.column_names] if has_upserts else list(primary_key)
            for name in columns:
                values = net.column(name).filter(inferring)
                flag = _FLAG + name
                if flag in net.column_names and _mask(net.column(flag).filter(inferring)).all():
                    continue  # no inferring row holds it: the record-by-record way never sees it
                data_type = values.type
                if values.null_count == len(values):
                    seen[name] = set()
                elif data_type in _INFERRED_KINDS:
                    seen[name] = {_INFERRED_KINDS[data_type]}
                else:
                    raise NotVectorisable(f"column {name!r} of schema-less records is {data_type}")
        return net, declared, seen


def _unchanged_texts(rows: int, pieces: list[tuple[str, np.ndarray]]) -> pa.Array:
    """Per row, the JSON list of the columns `pieces` leave to the sink there (null where none), written
    once per distinct combination."""
    if not pieces:
        return pa.nulls(rows, pa.string())
    combos, inverse = np.unique(np.column_stack([kept for _, kept in pieces]), axis=0, return_inverse=True)
    texts = [json.dumps([name for (name, _), flag in zip(pieces, combo) if flag], separators=(",", ":"))
             if combo.any() else None for combo in combos]
    return pa.array(texts, pa.string()).take(pa.array(inverse.reshape(-1), pa.int64()))


def _due(waiting: list[pa.Table], reduced: pa.Table | None) -> bool:
    """Whether tables waiting to be reduced hold as many rows as the reduced table, and `_REDUCE_ROWS`."""
    rows = sum(t.num_rows for t in waiting)
    return rows >= max(_REDUCE_ROWS, 0 if reduced is None else reduced.num_rows)


def _last_of(tables: list[pa.Table], conflict: str) -> pa.Table:
    """The last row per key (`_KEY`) of `tables` taken in order (`last_change.last_rows`)."""
    try:
        joined = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise NotVectorisable(f"{conflict} ({_shown(exc)})") from None
    return last_rows(joined, _KEY)


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


def is_avro(decode_value: Any) -> bool:
    """Whether a value decoder is the Confluent Avro one (imported only where Avro is in use)."""
    return type(decode_value).__name__ == "ConfluentAvroDecoder"


def _shown(error: Exception) -> str:
    """An Arrow error without the values it may quote (rows may carry personal data): its kind,
    and the column path when it names one."""
    column = _ERROR_COLUMN.search(str(error))
    return type(error).__name__ + (f" at {column.group(1)}" if column else "")


def typed_net(net: pa.Table, types: dict[str, str], primary_key: tuple[str, ...]) -> pa.Table:
    """The net rows as `typed_changes` lays them out: the typed columns of `types` (a delete
    keeps its primary key only); the caller appends the source columns (`meta_columns`)."""
    retract = net.column(_RETRACT)
    arrays, fields = [], []
    for name, type_name in types.items():
        target = arrow_type(type_name)
        if name not in net.column_names:
            column = pa.nulls(net.num_rows, target)
        else:
            column = _typed(net.column(name), type_name, target)
            if name not in primary_key and net.num_rows:
                column = pc.if_else(retract, pa.scalar(None, target), column)
        arrays.append(column)
        fields.append(pa.field(name, target))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _typed(column: pa.ChunkedArray, type_name: str, target: pa.DataType) -> pa.Array | pa.ChunkedArray:
    if column.type == target:
        return column
    if pa.types.is_null(column.type):
        return pa.nulls(len(column), target)
    if column.type in _INFERRED_KINDS or pa.types.is_string(column.type):
        typed, misfits = bulk_column(column, type_name)
        if misfits.any():
            raise NotVectorisable(f"a value cannot be converted to {type_name}")
        return typed
    try:
        return pc.cast(column, target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise NotVectorisable(f"a value cannot be converted to {type_name} ({_shown(exc)})") from None


def meta_columns(net: pa.Table) -> dict[str, pa.ChunkedArray]:
    """The source columns of the net rows, by role: key, kind, topic, partition, offset,
    change index, timestamp, unchanged."""
    kinds = pc.if_else(net.column(_RETRACT), ChangeKind.DELETE.value, ChangeKind.UPDATE_AFTER.value)
    return {"key": net.column(_KEY), "kind": kinds, "topic": net.column(_TOPIC),
            "partition": net.column(_PARTITION), "offset": net.column(_OFFSET),
            "change_index": net.column(_CHANGE_INDEX), "timestamp": net.column(_TIMESTAMP),
            "unchanged": net.column(_UNCHANGED)}


def decode_range(plan: VectorPlan, documents: JsonDocuments | Any, chunks: Iterable[ValueChunk]) -> RangeColumns:
    """All of a range's chunks folded into one `RangeColumns`; raises `NotVectorisable`."""
    columns = RangeColumns(plan, documents)
    for chunk in chunks:
        columns.add(chunk)
    return columns
