"""Vectorised decode of one Kafka range of Debezium JSON envelopes, straight to typed net changes.

The plain path's fast way (`partition_changes.PartitionReducer`): instead of parsing, converting
and re-encoding record by record, a batch's values are parsed together by `pyarrow.json` into
typed columns (the row images' types: the Connect schema block's, else inferred by Arrow over
the range), their changelog rows are built as Arrow columns and reduced to the last change per
primary key with a group-by. Python touches each record once, to cut a known schema block off
its payload (`JsonDocuments.payload_bytes`).

It produces what the record-by-record way does (`typed_changes` of the reduced rows), or
nothing: any record it cannot vouch for raises `NotVectorisable`, and the caller decodes the
whole range record by record, which then decides errors, policies and dead letters. It does not
vouch for: settings other than envelopes with an op field and plain op groupings; a tombstone
wrapper, an unknown or missing op code (truncates and messages included), an image missing or
without its primary key, a delete without its before image; Debezium's unavailable-value
placeholder; a payload with more than `MAX_NESTING` brackets; two schema blocks in one range;
declared types other than integers, floats, booleans, text, dates and integer-coded
millisecond/microsecond timestamps; a declared integer out of its type's range; a row column no
schema declares next to declared ones; nested or timestamp-looking inferred columns; integers of
19 digits or more where a column is inferred as float; key values other than integers, booleans
and plain printable ASCII text; values with raw line breaks; anything `pyarrow.json` refuses
(invalid JSON, duplicate names, mixed types).

One difference, decided: a schema-less column whose surviving values were all written as
integers, in a range where other records wrote it with a fraction, is float64 here (Arrow parses
the range's values as one column) and int64 the record-by-record way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from connectors.delta.arrow_types import TypeName, arrow_type
from connectors.kafka.range_reader import ValueChunk
from service.config.op_mapping import Grouping, parse_op_mapping
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder
from service.kafka_to_delta.formats.connect_wrapper import DOCUMENT_END, WRAPPER_HEAD
from service.kafka_to_delta.formats.debezium_json import (
    MAX_NESTING,
    UNAVAILABLE_VALUE,
    JsonDocuments,
)
from service.kafka_to_delta.formats.row_fit import INT_RANGES
from service.kafka_to_delta.materialize.last_change import last_rows
from vocabulary.changes import ChangeKind
from vocabulary.errors import DecodeError

_META = ("__vec_key", "__vec_retract", "__vec_declared", "__vec_topic", "__vec_partition", "__vec_offset",
         "__vec_change_index", "__vec_timestamp")
_KEY, _RETRACT, _DECLARED, _TOPIC, _PARTITION, _OFFSET, _CHANGE_INDEX, _TIMESTAMP = _META
_PARSE_TYPES: dict[str, pa.DataType] = {
    **{name: pa.int64() for name in (*TypeName.INTEGERS, TypeName.DATE32, TypeName.TIMESTAMP_MS,
                                     TypeName.TIMESTAMP_US)},
    **{name: pa.float64() for name in TypeName.FLOATS},
    TypeName.BOOL: pa.bool_(),
    TypeName.STRING: pa.string(),
}
"""Declared types this path parses, and the Arrow type each is parsed as."""
_INFERRED_KINDS = {pa.int64(): TypeName.INT64, pa.float64(): TypeName.FLOAT64, pa.bool_(): TypeName.BOOL,
                   pa.string(): TypeName.STRING}
_KEY_TYPES = (pa.int64(), pa.bool_(), pa.string())
_PLAIN_TEXT = r'^[ !#-\[\]-~]*$'  # printable ASCII without '"' and '\': its JSON is itself
_ERROR_COLUMN = re.compile(r"Column\((/[^)]*)\)")
_LONG_DIGIT_RUN = b"0" * 19
_DIGITS_TO_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_UNAVAILABLE = UNAVAILABLE_VALUE.encode()
_WRAPPER_HEAD = WRAPPER_HEAD.decode()
_US_PER_MS = 1_000  # timestamp_ms columns are stored in microseconds
_RETRACTING = (Grouping.UPDATE_BEFORE, Grouping.DELETE)
_STATELESS = (Grouping.INSERT, Grouping.UPDATE_AFTER, Grouping.UPSERT, Grouping.UPDATE, *_RETRACTING)


class NotVectorisable(Exception):
    """The range holds something only the record-by-record way decides; the reason says what."""


@dataclass(frozen=True)
class _Side:
    """What an op code takes from one image: whether it is a retraction, whether it is optional."""

    retract: bool
    optional: bool = False


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
    if not isinstance(decoder.decode_value, JsonDocuments) or decoder.decode_value.layout.passthrough:
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
        if grouping in _RETRACTING:
            codes[code] = (_Side(retract=True), None)
        elif grouping is Grouping.UPDATE:
            codes[code] = (_Side(retract=True, optional=True), _Side(retract=False))
        else:
            codes[code] = (None, _Side(retract=False))
    return VectorPlan(settings.op, settings.before, settings.after, codes, tuple(primary_key))


@dataclass
class RangeColumns:
    """The net changes of one range's batches, decoded and reduced in Arrow."""

    plan: VectorPlan
    documents: JsonDocuments
    changes: int = 0
    declared: dict[str, str] | None = None
    row_types: dict[str, pa.DataType] = field(default_factory=dict)
    """Row columns of known type (parsed as such in later batches)."""
    prefix: str | None = None
    """The schema block bytes (as text) before the payload of the range's wrappers."""
    order: dict[str, None] = field(default_factory=dict)
    """Every row column, in order of first appearance (null-typed ones included)."""
    net: pa.Table | None = None

    def add(self, chunk: ValueChunk) -> None:
        """Decode and fold in one chunk of the range's records; raises `NotVectorisable`."""
        present, payloads, wrapped = self._payloads(chunk.values)
        if not len(payloads):
            return
        parsed = self._parse(payloads)
        rows = self._changelog(parsed, wrapped)
        source = present.take(rows.column("__record"))
        rows = rows.drop_columns(["__record"])
        rows = rows.append_column(_TOPIC, pa.array([chunk.topic] * rows.num_rows, pa.string()))
        rows = rows.append_column(_PARTITION, pa.array(np.full(rows.num_rows, chunk.partition, np.int32)))
        rows = rows.append_column(_OFFSET, pa.array(chunk.offsets, pa.int64()).take(source))
        rows = rows.append_column(_TIMESTAMP, pa.array(chunk.timestamps, pa.int64()).take(source))
        self.changes += rows.num_rows
        if self.net is not None:
            try:
                rows = pa.concat_tables([self.net, rows], promote_options="default")
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise NotVectorisable(f"batches of the range typed a column differently ({_shown(exc)})") from None
        self.net = last_rows(rows, _KEY)

    def _payloads(self, values: list[bytes | None]) -> tuple[pa.Array, pa.Array, pa.Array]:
        """(record index, payload, declared?) of each record with a value (tombstones, which
        follow a delete, give nothing): a wrapper's payload is cut out of it, in Arrow."""
        column = pa.array(values, pa.binary())
        present = pc.indices_nonzero(column.is_valid())
        column = column.take(present)
        if self.prefix is None:
            self._learn_prefix(column)
        if self.prefix is None:
            wrapped = pa.array(np.zeros(len(column), np.bool_))
            payloads = column
        else:
            wrapped = pc.and_(pc.starts_with(column, pattern=self.prefix), pc.ends_with(column, pattern="}"))
            payloads = pc.if_else(wrapped, pc.binary_slice(column, len(self.prefix.encode()), -1), column)
        if pc.any(pc.and_(pc.invert(wrapped), pc.starts_with(column, pattern=_WRAPPER_HEAD))).as_py():
            raise NotVectorisable("two schema blocks in one range, or a wrapper whose payload cannot be cut out")
        return present, payloads, wrapped

    def _learn_prefix(self, column: pa.Array) -> None:
        """The schema block of the range's first wrapper (a full decode learns its column types)."""
        first = pc.index(pc.starts_with(column, pattern=_WRAPPER_HEAD), True).as_py()
        if first < 0:
            return
        value = column[first].as_py()
        try:
            payload, types = self.documents.payload_bytes(value)
            prefix = value[:len(value) - len(payload) - len(DOCUMENT_END)].decode()
        except (DecodeError, ValueError) as exc:  # UnicodeDecodeError included
            raise NotVectorisable(f"a value is not a plain envelope ({type(exc).__name__})") from None
        if types is None:
            raise NotVectorisable("a value starts like a wrapper but is not one")
        self._declare(types)
        self.prefix = prefix

    def _declare(self, types: dict[str, str]) -> None:
        parse = {name: _PARSE_TYPES.get(type_name) for name, type_name in types.items()}
        missing = [name for name, data_type in parse.items() if data_type is None]
        if missing:
            raise NotVectorisable(f"declared column {missing[0]!r} has a type this path does not parse")
        if len({name.lower() for name in types}) != len(types):
            raise NotVectorisable("declared columns differ only by case")
        if self.row_types and any(self.row_types.get(name, parse[name]) != parse[name] for name in parse):
            raise NotVectorisable("declared types differ from the range's earlier records")
        if self.row_types.keys() - types.keys():
            raise NotVectorisable("a row column no schema declares next to declared ones")
        self.declared = types
        self.row_types = {**parse}
        self.order = dict.fromkeys([*types, *self.order])

    def _parse(self, payloads: pa.Array) -> pa.Table:
        if not pc.all(pc.and_(pc.starts_with(payloads, pattern="{"), pc.ends_with(payloads, pattern="}"))).as_py():
            raise NotVectorisable("a payload is not one JSON object")
        brackets = pc.add(pc.count_substring(payloads, "{"), pc.count_substring(payloads, "["))
        if pc.max(brackets).as_py() > MAX_NESTING:  # as `debezium_json.loads` screens them
            raise NotVectorisable(f"a value may nest deeper than {MAX_NESTING} levels")
        buffer = _lines(payloads)
        if buffer.count(b"\n") != len(payloads) or b"\r" in buffer:
            raise NotVectorisable("a value holds a raw line break")
        if _UNAVAILABLE in buffer:
            raise NotVectorisable("unavailable-value placeholders")
        row = pa.struct([pa.field(name, data_type) for name, data_type in self.row_types.items()])
        schema = pa.schema([(self.plan.op, pa.string()), (self.plan.before, row), (self.plan.after, row)])
        try:
            table = pj.read_json(
                pa.py_buffer(buffer), read_options=pj.ReadOptions(use_threads=False, block_size=len(buffer) + 1),
                parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer"),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise NotVectorisable(f"pyarrow.json refused the values ({_shown(exc)})") from None
        if table.num_rows != len(payloads):
            raise NotVectorisable("a value holds more than one JSON document")
        self._learn(table, buffer)
        return table

    def _learn(self, table: pa.Table, buffer: bytes) -> None:
        """Check the images' inferred columns and adopt their types for the range's next batches."""
        types: dict[str, pa.DataType] = {}
        for side in (self.plan.before, self.plan.after):
            for child in table.schema.field(side).type:
                known = types.setdefault(child.name, child.type)
                if known != child.type and pa.types.is_null(known):
                    types[child.name] = child.type
                elif known != child.type and not pa.types.is_null(child.type):
                    raise NotVectorisable(f"column {child.name!r} typed differently in the two images")
        inferred = {name: data_type for name, data_type in types.items() if name not in self.row_types}
        if inferred and self.declared is not None:
            raise NotVectorisable("a row column no schema declares next to declared ones")
        for name, data_type in inferred.items():
            if not pa.types.is_null(data_type) and data_type not in _INFERRED_KINDS:
                raise NotVectorisable(f"column {name!r} is inferred as {data_type}")
            if pa.types.is_floating(data_type) and _LONG_DIGIT_RUN in buffer.translate(_DIGITS_TO_ZERO):
                raise NotVectorisable("integers of 19 digits or more may sit in a float column")
        self.row_types.update({n: t for n, t in inferred.items() if not pa.types.is_null(t)})
        self.order.update(dict.fromkeys(types))
        self._check_ranges(table)

    def _check_ranges(self, table: pa.Table) -> None:
        """Declared integer-coded columns hold values their types can hold (as `row_fit` checks)."""
        for name, type_name in (self.declared or {}).items():
            bounds = INT_RANGES.get(type_name)
            if bounds is None or bounds == INT_RANGES[TypeName.INT64]:
                continue
            for side in (self.plan.before, self.plan.after):
                extremes = pc.min_max(pc.struct_field(table.column(side), name)).as_py()
                if extremes["min"] is not None and not bounds[0] <= extremes["min"] <= extremes["max"] <= bounds[1]:
                    raise NotVectorisable(f"column {name!r} holds a value out of the range of {type_name}")

    def _changelog(self, parsed: pa.Table, wrapped: pa.Array) -> pa.Table:
        """The changelog rows of the parsed records, in source order (record, change index)."""
        op = parsed.column(self.plan.op)
        known = pc.is_in(op, pa.array(list(self.plan.codes), pa.string()))
        if not pc.all(pc.fill_null(known, False)).as_py():
            raise NotVectorisable("an op code that is missing, null or not a plain change")
        codes_by_side: dict[tuple[int, _Side], list[str]] = {}
        for code, pair in self.plan.codes.items():
            for position, side in enumerate(pair):
                if side is not None:
                    codes_by_side.setdefault((position, side), []).append(code)
        emitted_before = None
        tables = []
        for (position, side), codes in sorted(codes_by_side.items(), key=lambda item: item[0][0]):
            side_name, retract = (self.plan.before, self.plan.after)[position], side.retract
            emits = pc.is_in(op, pa.array(codes, pa.string()))
            image = parsed.column(side_name).combine_chunks()
            valid = image.is_valid()
            if side.optional:
                emits = pc.and_(emits, valid)
            elif not pc.all(pc.or_(pc.invert(emits), valid)).as_py():
                raise NotVectorisable(f"a record without its {side_name!r} image")
            if position == 0:
                emitted_before = emits if emitted_before is None else pc.or_(emitted_before, emits)
            index = pc.indices_nonzero(emits)
            if not len(index):
                continue
            rows = pa.Table.from_arrays(image.flatten(), names=[f.name for f in image.type]).take(index)
            change_index = (pc.cast(emitted_before.take(index), pa.int32()) if position == 1 and emitted_before
                            is not None else pa.array(np.zeros(len(index), np.int32)))
            tables.append(self._keyed(rows, side_name).append_column(_RETRACT, pa.array(np.full(len(index), retract)))
                          .append_column(_DECLARED, wrapped.take(index))
                          .append_column(_CHANGE_INDEX, change_index)
                          .append_column("__record", index))
        if not tables:
            return self._empty()
        try:
            rows = self._conformed(pa.concat_tables(tables, promote_options="default"))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise NotVectorisable(f"the two images typed a column differently ({_shown(exc)})") from None
        order = pc.sort_indices(pa.table({"r": rows.column("__record"), "c": rows.column(_CHANGE_INDEX)}),
                                [("r", "ascending"), ("c", "ascending")])
        return rows.take(order)

    def _keyed(self, rows: pa.Table, side_name: str) -> pa.Table:
        """`rows` with their primary-key text (`canonical_key` of the key values)."""
        parts = []
        for column in self.plan.primary_key:
            if column not in rows.column_names:
                raise NotVectorisable(f"primary key column {column!r} is not in the {side_name!r} image")
            values = rows.column(column)
            if values.null_count:
                raise NotVectorisable(f"primary key column {column!r} is null in a {side_name!r} image")
            if values.type not in _KEY_TYPES:
                raise NotVectorisable(f"primary key column {column!r} is {values.type}")
            if values.type == pa.string():
                if not pc.all(pc.match_substring_regex(values, _PLAIN_TEXT)).as_py():
                    raise NotVectorisable(f"primary key column {column!r} holds text that JSON escapes")
                parts.append(pc.binary_join_element_wise('"', values, '"', ""))
            elif values.type == pa.bool_():
                parts.append(pc.if_else(values, "true", "false"))
            else:
                parts.append(pc.cast(values, pa.string()))
        return rows.append_column(_KEY, pc.binary_join_element_wise("[", pc.binary_join_element_wise(*parts, ","),
                                                                    "]", ""))

    def _conformed(self, rows: pa.Table) -> pa.Table:
        """Rows with the range's current columns, in its order (null-typed ones as they came)."""
        names = [n for n in self.order if n in rows.column_names]
        return rows.select(names + [n for n in rows.column_names if n not in self.order])

    def _empty(self) -> pa.Table:
        fields = [pa.field(n, self.row_types.get(n, pa.null())) for n in self.order]
        return pa.schema([*fields, (_KEY, pa.string()), (_RETRACT, pa.bool_()), (_DECLARED, pa.bool_()),
                          (_CHANGE_INDEX, pa.int32()), ("__record", pa.int64())]).empty_table()

    def result(self, primary_key: tuple[str, ...]) -> tuple[pa.Table | None, dict[str, str], dict[str, set[str]]]:
        """(net rows, declared types, seen kinds) as `typed_changes` gives them, before typing."""
        net = self.net
        if net is None or net.num_rows == 0:
            return None, {}, {}
        retract = net.column(_RETRACT)
        declared_rows = net.column(_DECLARED)
        declared = dict(self.declared) if self.declared is not None and pc.any(declared_rows).as_py() else {}
        upserts = pc.invert(retract)
        has_upserts = pc.any(upserts).as_py()
        bare = pc.invert(declared_rows)
        seen: dict[str, set[str]] = {}
        inferring = pc.and_(bare, upserts) if has_upserts else bare  # the rows `typed_changes` infers from
        if pc.any(inferring).as_py():
            columns = [n for n in net.column_names if n not in _META] if has_upserts else list(primary_key)
            for name in columns:
                values = net.column(name).filter(inferring)
                data_type = values.type
                seen[name] = set() if values.null_count == len(values) else {_INFERRED_KINDS[data_type]}
        return net, declared, seen


def _shown(error: Exception) -> str:
    """An Arrow error without the values it may quote (rows may carry personal data): its kind,
    and the column path when it names one."""
    column = _ERROR_COLUMN.search(str(error))
    return type(error).__name__ + (f" at {column.group(1)}" if column else "")


def _lines(payloads: pa.Array) -> bytes:
    """The payloads as newline-delimited JSON text (each followed by a newline)."""
    joined = pc.binary_join_element_wise(payloads, pa.scalar(b"\n"), pa.scalar(b""))
    offsets = np.frombuffer(joined.buffers()[1], dtype=np.int32)[joined.offset:joined.offset + len(joined) + 1]
    return joined.buffers()[2][int(offsets[0]):int(offsets[-1])].to_pybytes()


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


def _typed(column: pa.ChunkedArray, type_name: str, target: pa.DataType) -> pa.ChunkedArray:
    if column.type == target:
        return column
    try:
        if pa.types.is_null(column.type):
            return pa.chunked_array([pa.nulls(len(column), target)])
        if type_name == TypeName.TIMESTAMP_MS:
            return pc.cast(pc.multiply_checked(column, _US_PER_MS), target)
        if type_name == TypeName.DATE32:
            return pc.cast(pc.cast(column, pa.int32()), target)
        if pa.types.is_floating(target) and pa.types.is_floating(column.type):
            return pc.cast(column, target, safe=False)
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
            "unchanged": pa.nulls(net.num_rows, pa.string())}


def decode_range(plan: VectorPlan, documents: JsonDocuments, chunks: Iterable[ValueChunk]) -> RangeColumns:
    """All of a range's chunks folded into one `RangeColumns`; raises `NotVectorisable`."""
    columns = RangeColumns(plan, documents)
    for chunk in chunks:
        columns.add(chunk)
    return columns
