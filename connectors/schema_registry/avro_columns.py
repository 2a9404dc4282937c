"""Confluent-framed Avro values decoded in bulk: Arrow columns per schema id, no Python object per record.

`decode_avro_columns(values, client)` (or `BulkAvroDecoder(client).decode(values)`) groups the
values by schema id and, per id, puts the values whole into one in-memory Avro object container
file (header with the writer schema stripped of logical types, between a leading 5-byte `fixed`
that takes the frame and a trailing sentinel; one block) that polars-avro reads
(`arrow-avro`, Apache Arrow's Rust columnar Avro decoder, through the Arrow C data interface).
The raw columns are then typed with vectorised Arrow/numpy kernels to exactly what
`connectors.delta.arrow_types.typed_column` gives for the reference decoder's value
(`ConfluentAvroDecoder.decode`) and column type: for every row image column,

    table["after"].field(c)  ==  typed_column(c, types[c], [doc["after"][c] for doc in documents])

(the struct's children carry the struct's nulls: use `StructArray.flatten()`, not `.field()`,
on arrays from elsewhere). The same holds for `before` and for the envelope's other top-level
fields, typed with the envelope's own field types; `source` and `transaction` are dropped. A
flat (non-envelope) record gives its fields as columns, typed with the codec's column types.

Where the typed result comes from, per column type (raw = the Avro value without logical type):
  ints, floats, bool, string, binary, enum   raw column, cast (enum: dictionary -> string)
  date32                                     raw int -> date32
  timestamps (long)                          raw number in the unit of the Avro annotation ->
                                             microseconds (x1000 for millis, floor //1000 for nanos)
  timestamp_us_utc from a string             Arrow's ISO-8601 cast (Debezium ZonedTimestamp)
  decimal(p,s) from bytes/fixed              the unscaled big-endian two's complement -> decimal128
                                             (decimal256 above 38 digits) by numpy, exact
  nested values (records, arrays) as JSON    per value: the reference's reader conversion, then
                                             typed_column (a Python object per value, these
                                             columns only)
Any column whose vectorised conversion Arrow refuses (a ZonedTimestamp text it does not parse,
a decimal of more than 16/32 bytes) takes that per-value path, so the result stays the reference's.

What differs from the reference decoder's *document* (not its typed result): the document holds
JSON forms (decimals and bytes as base64 text, dates as epoch days, timestamps as epoch numbers,
nested values as objects); the table holds the typed Arrow values those forms become. To get the
reference's typed rows in bulk, take the table's columns as they are (`table["after"].flatten()`
gives one array per column, equal to `rows_to_table(after_rows, column_types)`'s columns).

Records not decoded in bulk come back in `fallback`, to decode one by one with the reference
decoder (which then raises the precise error or decodes them): short frames and wrong magic
bytes, unknown or unusable schema ids (and an unreachable registry), schemas the bulk path does
not take (maps, unions of several non-null types, recursive records, a `before` record other
than `after`'s, schemas arrow-avro refuses), bodies that do not decode (found by halving the
failed read, then the failing half, and so on, and in a failed part of at most `LOCATE` records by
the reference reader: invalid UTF-8, a union or enum index the reader refuses, a length past the
end) or do not end where the next begins, records that took a union branch their schema does not have
(`checked_unions`: arrow-avro reads any non-null index of a nullable union as the value, fastavro
refuses an index outside the union), and a whole schema id's records when a value does not fit
its column type (the reference's typing raises there too). Tombstones (None) come back in
`tombstones`. One bad record costs a re-read of the rest of its block (a moved sentinel) or
about ten more reads of parts of it (see `_read_all`); the others stay in bulk.

The envelope's `source` and `transaction` are decoded too (their union indices are checked), but
not kept. A field the reader skips would not be checked: only a dropped field the bulk path does
not take (a map, a multi-type union) is skipped.

The container's schema is the registered one without logical types, written out in full by
`checked_unions.with_checked_unions` (named types defined where used, under generated names;
each nullable union with a third, unused branch): the raw columns come back as dense unions and
are read back to nullable arrays before typing.

Boundaries: concatenated bodies lose their lengths, so each body is followed in the block by a
random 8-byte sentinel, read as an extra `fixed` field; a body longer or shorter than its record
shifts the sentinel, and that record and the rest are re-read. arrow-avro loops forever on a block
whose bytes outlast its record count (its reader asks the decoder for 0 more records); reading
exactly one batch of exactly the block's record count returns before it gets there, so the
iterator is never advanced a second time.
"""

from __future__ import annotations

import base64
import io
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.delta.arrow_types import (
    ARROW_TYPES,
    DECIMAL_PATTERN,
    TypeName,
    arrow_type,
    string_list_texts,
    typed_column,
)
from connectors.schema_registry import avro_values as values
from connectors.schema_registry.avro_codec import (
    AvroRecordCodec,
    ConfluentAvroDecoder,
    without_logical_types,
)
from connectors.schema_registry.avro_types import (
    AVRO_NULL,
    BINARY_TYPES,
    base_type,
    column_type,
    non_null,
    resolve,
    timestamp_unit,
)
from connectors.schema_registry.checked_unions import (
    RecursiveSchema,
    with_checked_unions,
    without_checked_unions,
)
from connectors.schema_registry.client import SchemaRegistryClient
from connectors.schema_registry.errors import DecodeError, SchemaRegistryUnavailable
from connectors.schema_registry.wire_format import HEADER, HEADER_SIZE, MAGIC_BYTE
from vocabulary.changes import Envelope

DROPPED_ENVELOPE_FIELDS = frozenset({Envelope.SOURCE, "transaction"})
IMAGE_FIELDS = (Envelope.BEFORE, Envelope.AFTER)
SENTINEL_SIZE = 8
SENTINEL_FIELD = "cdc_lakehouse_bulk_end"
SENTINEL_TYPE = "CdcLakehouseBulkEnd"
FRAME_FIELD = "cdc_lakehouse_frame"  # the 5 bytes of the Confluent frame, read as a leading `fixed`
FRAME_TYPE = "CdcLakehouseFrame"
CONTAINER_MAGIC = b"Obj\x01"
SYNC_SIZE = 16
_TIMESTAMP_TO_US: dict[str, tuple[int, int]] = {  # column type -> (multiply, floor-divide) of the stored number
    TypeName.TIMESTAMP_MS: (1_000, 1),
    TypeName.TIMESTAMP_US: (1, 1),
    TypeName.TIMESTAMP_NS: (1, 1_000),
    TypeName.TIMESTAMP_US_UTC: (1, 1),
}
_READER_TO_US = {"ms": (1_000, 1), "us": (1, 1), "ns": (1, 1_000)}  # the reference reader's UTC conversion


class _Unfit(Exception):
    """A value that does not fit its column type: the schema id's records go record by record."""


@dataclass(frozen=True)
class SchemaColumns:
    """The records of one schema id decoded in bulk.

    `indices`: their positions in the input list, ascending; `table`: one row per index;
    `column_types`: the reference decoder's types map for the schema (`codec.column_types`).
    """

    schema_id: int
    indices: list[int]
    table: pa.Table
    column_types: dict[str, str]
    is_envelope: bool
    json_form: pa.Table | None = None
    """With `decode(json_forms=True)`: the same rows as the reference decoder's document holds them (the
    raw Avro values, bytes and fixed as base64 text), None where a column needs another conversion."""


@dataclass(frozen=True)
class BulkDecoded:
    """`groups` by schema id; `fallback`: positions to decode one by one; `tombstones`: None values."""

    groups: dict[int, SchemaColumns] = field(default_factory=dict)
    fallback: list[int] = field(default_factory=list)
    tombstones: list[int] = field(default_factory=list)


def _zigzag(number: int) -> bytes:
    number = (number << 1) ^ (number >> 63)
    out = bytearray()
    while number & ~0x7F:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


def _avro_bytes(data: bytes) -> bytes:
    return _zigzag(len(data)) + data


def _sentinel() -> bytes:
    """8 random bytes with no period shorter than 8, so a shifted read cannot match them."""
    while True:
        candidate = os.urandom(SENTINEL_SIZE)
        if all(candidate[shift:] != candidate[:-shift] for shift in range(1, SENTINEL_SIZE)):
            return candidate


def _bulk_problem(schema: Any, named: dict[str, Any], visiting: frozenset[str] = frozenset()) -> str | None:
    """Why a (parsed) field type cannot be read in bulk, or None."""
    if isinstance(schema, list):
        branches = [branch for branch in schema if branch != AVRO_NULL]
        if len(branches) > 1:
            return "a union of several non-null types"
        return _bulk_problem(branches[0], named, visiting) if branches else "a union of null alone"
    schema = resolve(schema, named)
    kind = base_type(schema)
    if kind == "map":
        return "a map"
    if kind == "array":
        return _bulk_problem(schema["items"], named, visiting)
    if kind == "record":
        if schema["name"] in visiting:
            return "a recursive record"
        inner = visiting | {schema["name"]}
        for item in schema["fields"]:
            problem = _bulk_problem(item["type"], named, inner)
            if problem is not None:
                return problem
    return None


@dataclass(frozen=True)
class _Column:
    """How one raw column becomes its typed column."""

    name: str
    type_name: str
    avro: Any  # the parsed field type
    named: dict[str, Any]

    def typed(self, raw: pa.Array) -> pa.Array:
        converted = _vectorised(raw, self.type_name, self.avro, self.named)
        if converted is not None:
            return converted
        reader = values.reader(self.avro, self.named)
        items = raw.to_pylist()
        if reader is not None:
            items = [None if item is None else reader(item) for item in items]
        try:
            return typed_column(self.name, self.type_name, items)
        except ValueError as exc:
            raise _Unfit(str(exc)) from None


def _plain(raw: pa.Array) -> pa.Array:
    kind = raw.type
    if pa.types.is_dictionary(kind):
        return raw.cast(pa.string())  # an enum's symbols
    if pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return raw.cast(pa.string())
    if pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind) or pa.types.is_fixed_size_binary(kind):
        return raw.cast(pa.binary())
    return raw


def _vectorised(raw: pa.Array, type_name: str, avro: Any, named: dict[str, Any]) -> pa.Array | None:
    """The typed column without a Python object per value, or None where only the per-value path knows."""
    base = non_null(avro, named)
    kind = base_type(base) if base is not None else None
    if kind == "array" and type_name == TypeName.STRING and pa.types.is_list(raw.type) \
            and pa.types.is_string(raw.type.value_type) and values.reader(avro, named) is None:
        return string_list_texts(raw)  # a list of texts: its JSON text, as the per-value path writes it
    if kind in ("record", "array", "map") or kind is None:
        return None
    raw = _plain(raw)
    try:
        if DECIMAL_PATTERN.match(type_name):
            return _decimals(raw, arrow_type(type_name)) if kind in BINARY_TYPES else None
        if type_name in _TIMESTAMP_TO_US:
            return _timestamps(raw, type_name, base)
        target = ARROW_TYPES[type_name]
        if type_name == TypeName.DATE32 and pa.types.is_integer(raw.type):
            return pc.cast(raw, pa.int32()).cast(pa.date32())
        if type_name in TypeName.INTEGERS and pa.types.is_integer(raw.type):
            return pc.cast(raw, target)
        if type_name in TypeName.FLOATS and (pa.types.is_floating(raw.type) or pa.types.is_integer(raw.type)):
            return pc.cast(raw, target)
        if raw.type == target and type_name in (TypeName.BOOL, TypeName.STRING, TypeName.BINARY):
            return raw
    except pa.ArrowInvalid as exc:  # an integer out of range of its column type
        raise _Unfit(f"a value cannot be converted to {type_name}") from exc
    return None


def _timestamps(raw: pa.Array, type_name: str, base: Any) -> pa.Array | None:
    target = ARROW_TYPES[type_name]
    if pa.types.is_string(raw.type):
        if type_name != TypeName.TIMESTAMP_US_UTC:
            return None
        try:
            return pc.cast(raw, target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None  # a text Arrow's ISO-8601 parser refuses: per value, as the reference
    if not pa.types.is_integer(raw.type):
        return None
    numbers = pc.cast(raw, pa.int64())
    unit = timestamp_unit(base)
    steps = [_TIMESTAMP_TO_US[type_name]]
    if type_name == TypeName.TIMESTAMP_US_UTC and unit is not None:
        steps.insert(0, _READER_TO_US[unit])
    for multiply, divide in steps:
        if multiply != 1:
            numbers = pc.multiply_checked(numbers, multiply)
        if divide != 1:
            numbers = _floor_divide(numbers, divide)
    return numbers.cast(target)


def _floor_divide(numbers: pa.Array, divisor: int) -> pa.Array:
    """Python's `//` (toward minus infinity; Arrow's divide truncates toward zero)."""
    filled = pc.fill_null(numbers, 0).to_numpy(zero_copy_only=False)
    return pa.array(np.floor_divide(filled, divisor), pa.int64(), mask=numbers.is_null().to_numpy(zero_copy_only=False))


def _decimals(raw: pa.Array, target: pa.DataType) -> pa.Array | None:
    """Unscaled big-endian two's complement bytes -> decimal128/256, exactly; None for too many bytes."""
    if not pa.types.is_binary(raw.type):
        return None
    width = 16 if pa.types.is_decimal128(target) else 32
    count = len(raw)
    validity, offsets_buffer, data_buffer = raw.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int32)[raw.offset : raw.offset + count + 1].astype(np.int64)
    lengths = np.diff(offsets)
    if count and lengths.max(initial=0) > width:
        return None
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    out = np.zeros((count, width), np.uint8)
    has_bytes = lengths > 0
    first = np.zeros(count, np.uint8)
    first[has_bytes] = data[offsets[:-1][has_bytes]]
    out[first >= 0x80] = 0xFF  # sign extension
    total = int(lengths.sum())
    if total:
        rows = np.repeat(np.arange(count), lengths)
        starts = np.repeat(offsets[:-1], lengths)
        within = _positions(lengths)
        out[rows, lengths[rows] - 1 - within] = data[starts + within]
    mask_buffer = None
    if raw.null_count:
        mask_buffer = pa.array(raw.is_valid().to_numpy(zero_copy_only=False)).buffers()[1]
    typed = pa.Array.from_buffers(target, count, [mask_buffer, pa.py_buffer(out.tobytes())], null_count=raw.null_count)
    try:
        typed.validate(full=True)  # a value with more digits than the precision
    except pa.ArrowInvalid as exc:
        raise _Unfit(f"a value cannot be converted to {target}") from exc
    return typed


def _positions(lengths: np.ndarray) -> np.ndarray:
    """0, 1, ..., n-1 for each length n, concatenated."""
    total = int(lengths.sum())
    ends = np.cumsum(lengths)
    return np.arange(total) - np.repeat(ends - lengths, lengths)


@dataclass(frozen=True)
class _Plan:
    """What one schema id's bulk read needs: the container header, projection and column typing."""

    header: bytes
    sync: bytes
    columns: list[str]
    fields: list[tuple[str, Callable[[pa.Array], pa.Array]]]
    is_envelope: bool
    column_types: dict[str, str]
    reference: AvroRecordCodec
    forms: dict[str, Callable[[pa.Array], pa.Array | None]] = field(default_factory=dict)
    """Per field, its raw column -> the document's JSON form (`json_form`)."""

    def refused(self, framed: Sequence[bytes], start: int, end: int) -> int | None:
        """The first of `framed[start:end]` the reference reader refuses, None if it reads them all."""
        for index in range(start, end):
            try:
                self.reference.read(memoryview(framed[index])[HEADER_SIZE:])
            except ValueError:
                return index
        return None

    def read(self, framed: Sequence[bytes], sentinel: bytes) -> tuple[pa.RecordBatch, int | None]:
        """The raw batch of `framed` values and the position of the first shifted sentinel (None if none).

        The values go into the block whole, frame included (the container's record starts with a
        5-byte `fixed`): no Python object per record.
        """
        from polars_avro._avro_rs import AvroSource  # imported on first use: polars is heavy

        data = sentinel.join(framed) + sentinel
        block = _zigzag(len(framed)) + _zigzag(len(data))
        container = io.BytesIO(b"".join((self.header, block, data, self.sync)))

        class _Source:
            def __enter__(self) -> io.BytesIO:
                container.seek(0)
                return container

            def __exit__(self, *exc: object) -> None:
                return None

        source = _Source()
        batches = AvroSource([lambda: source], False, False).batch_iter(len(framed), self.columns)
        batch = pa.record_batch(next(batches))  # once only: see the module docstring
        if batch.num_rows != len(framed):
            raise ValueError("the block gave another number of records")
        ends = batch.column(self.columns.index(SENTINEL_FIELD))
        read = np.frombuffer(ends.buffers()[1], np.uint64)[ends.offset : ends.offset + len(framed)]
        shifted = np.flatnonzero(read != np.frombuffer(sentinel, np.uint64)[0])
        return batch, (int(shifted[0]) if len(shifted) else None)

    def nullable(self, batch: pa.RecordBatch) -> tuple[pa.RecordBatch, np.ndarray]:
        """The batch's checked unions back to nullable columns (dropped fields left out), and the
        mask of the rows whose union index is out of range for their schema."""
        bad = np.zeros(batch.num_rows, bool)
        kept = {name for name, _ in self.fields}
        arrays, names = [], []
        for name, column in zip(batch.schema.names, batch.columns):
            if name == SENTINEL_FIELD:
                continue
            array, misread = without_checked_unions(column)
            bad |= misread
            if name in kept:
                arrays.append(array)
                names.append(name)
        return pa.RecordBatch.from_arrays(arrays, names=names), bad

    def typed(self, raw: pa.Table) -> pa.Table:
        arrays = [convert(raw.column(name).combine_chunks()) for name, convert in self.fields]
        return pa.Table.from_arrays(arrays, names=[name for name, _ in self.fields])

    def json_form(self, raw: pa.Table) -> pa.Table | None:
        """The raw columns as the reference decoder's document holds them; None where one needs a
        conversion other than bytes to base64 (then only its typed columns are there)."""
        arrays = []
        for name, _ in self.fields:
            form = self.forms.get(name)
            array = None if form is None else form(raw.column(name).combine_chunks())
            if array is None:
                return None
            arrays.append(array)
        return pa.Table.from_arrays(arrays, names=[name for name, _ in self.fields])


def _json_form(avro: Any, named: dict[str, Any]) -> Callable[[pa.Array], pa.Array | None] | None:
    """How a raw column of Avro type `avro` becomes its JSON form: as it is (what `avro_values.reader` leaves
    alone), bytes and fixed as base64 text; None for any other conversion (timestamps rescaled, bytes
    inside records or arrays, unions of several types)."""
    reader = values.reader(avro, named)
    if reader is None:
        return _plain
    base = non_null(avro, named)
    if base_type(resolve(base, named)) in BINARY_TYPES:
        return _base64_texts
    return None


def _record_form(record: dict, named: dict[str, Any]) -> Callable[[pa.Array], pa.Array | None] | None:
    forms = [(item["name"], _json_form(item["type"], named)) for item in record["fields"]]
    if any(form is None for _, form in forms):
        return None

    def convert(raw: pa.Array) -> pa.Array | None:
        children = [form(child) for (_, form), child in zip(forms, raw.flatten())]  # type: ignore[misc]
        if any(child is None for child in children):
            return None
        mask = raw.is_null() if raw.null_count else None
        return pa.StructArray.from_arrays(children, names=[name for name, _ in forms], mask=mask)

    return convert


def _base64_texts(raw: pa.Array) -> pa.Array:
    raw = _plain(raw)
    return pa.array([None if value is None else base64.b64encode(value).decode("ascii") for value in raw.to_pylist()],
                    pa.string())


def _image_converter(record: dict, named: dict[str, Any], types: dict[str, str]) -> Callable[[pa.Array], pa.Array]:
    columns = [_Column(item["name"], types[item["name"]], item["type"], named) for item in record["fields"]]

    def convert(raw: pa.Array) -> pa.Array:
        children = raw.flatten()  # children with the struct's nulls
        typed = [column.typed(child) for column, child in zip(columns, children)]
        mask = raw.is_null() if raw.null_count else None
        return pa.StructArray.from_arrays(typed, names=[column.name for column in columns], mask=mask)

    return convert


def _plan(codec: AvroRecordCodec) -> _Plan:
    """The bulk plan of a compiled schema; raises `_Unfit` for a schema the bulk path does not take."""
    import fastavro

    named: dict[str, Any] = {}
    parsed: Any = fastavro.parse_schema(codec.definition, named)
    fields: list[tuple[str, Callable[[pa.Array], pa.Array]]] = []
    forms: dict[str, Any] = {}
    images: list[str] = []
    checked: list[str] = []  # every field the reader decodes (the rest it skips, unchecked)
    for item in parsed["fields"]:
        name = item["name"]
        problem = _bulk_problem(item["type"], named)
        if codec.is_envelope and name in DROPPED_ENVELOPE_FIELDS:
            if problem is None:
                checked.append(name)
            continue
        checked.append(name)
        if problem is not None:
            raise _Unfit(f"field {name!r} holds {problem}")
        image = non_null(item["type"], named) if codec.is_envelope and name in IMAGE_FIELDS else None
        if isinstance(image, dict) and image.get("type") == "record":
            images.append(image["name"])
            fields.append((name, _image_converter(image, named, codec.column_types)))
            forms[name] = _record_form(image, named)
        else:
            forms[name] = _json_form(item["type"], named)
            type_name = codec.column_types[name] if not codec.is_envelope else column_type(item["type"], named)
            fields.append((name, _Column(name, type_name, item["type"], named).typed))
    if len(set(images)) > 1:
        raise _Unfit("before and after are different records")
    try:
        definition = with_checked_unions(without_logical_types(codec.definition))
    except RecursiveSchema as exc:
        raise _Unfit(str(exc)) from None
    taken = {item["name"] for item in definition["fields"]}
    if {SENTINEL_FIELD, FRAME_FIELD} & taken or any(kind in json.dumps(definition) for kind in (SENTINEL_TYPE, FRAME_TYPE)):
        raise _Unfit("the schema uses a name the bulk container needs")
    frame_field = {"name": FRAME_FIELD, "type": {"type": "fixed", "name": FRAME_TYPE, "size": HEADER_SIZE}}
    sentinel_field = {"name": SENTINEL_FIELD, "type": {"type": "fixed", "name": SENTINEL_TYPE, "size": SENTINEL_SIZE}}
    definition = {**definition, "fields": [frame_field, *definition["fields"], sentinel_field]}
    sync = os.urandom(SYNC_SIZE)
    metadata = {"avro.schema": json.dumps(definition).encode(), "avro.codec": b"null"}
    header = CONTAINER_MAGIC + _zigzag(len(metadata))
    header += b"".join(_avro_bytes(key.encode()) + _avro_bytes(value) for key, value in metadata.items())
    header += b"\x00" + sync
    return _Plan(header, sync, [*checked, SENTINEL_FIELD], fields, codec.is_envelope, codec.column_types, codec,
                 {name: form for name, form in forms.items() if form is not None})


_SKIP_EXCEPTIONS = (KeyboardInterrupt, SystemExit, GeneratorExit)
LOCATE = 512
"""A failed read of at most this many records is scanned with the reference reader for the record it
refuses (about 10 us a record, against about 2 ms for any read of the Rust reader); a larger one is halved."""


class BulkAvroDecoder:
    """Decodes lists of Confluent-framed Avro values to Arrow tables per schema id.

    Holds the reference decoder (its compiled codecs and registry client) and one bulk plan per
    schema id; a schema the bulk path does not take is remembered and its records go record by
    record. Not thread-safe for the first use of a schema id (plans are then built twice, harmlessly).
    """

    def __init__(self, client: SchemaRegistryClient | ConfluentAvroDecoder) -> None:
        self.reference = client if isinstance(client, ConfluentAvroDecoder) else ConfluentAvroDecoder(client)
        self._plans: dict[int, _Plan | None] = {}

    def plan(self, schema_id: int) -> _Plan | None:
        """The bulk plan of a schema id; None when its records go record by record."""
        if schema_id in self._plans:
            return self._plans[schema_id]
        try:
            plan: _Plan | None = _plan(self.reference.codec(schema_id))
        except (DecodeError, _Unfit):
            plan = None
        except SchemaRegistryUnavailable:
            return None  # not remembered: the registry may answer next time
        self._plans[schema_id] = plan
        return plan

    def decode(self, framed: Sequence[bytes | None], json_forms: bool = False) -> BulkDecoded:
        """Groups, fallback positions and tombstone positions of `framed` (see the module docstring);
        `json_forms`: each group also holds its rows in the document's JSON form (`SchemaColumns.json_form`)."""
        result = BulkDecoded()
        headers = [None if value is None else value[:HEADER_SIZE] for value in framed]
        by_header: dict[bytes | None, list[int]] = {}
        if len(set(headers)) == 1:  # one schema id (or only tombstones): no loop over the records
            by_header[headers[0]] = list(range(len(framed)))
        else:
            for position, header in enumerate(headers):
                by_header.setdefault(header, []).append(position)
        for header, positions in by_header.items():
            if header is None:
                result.tombstones.extend(positions)
                continue
            if len(header) < HEADER_SIZE or header[0] != MAGIC_BYTE:
                result.fallback.extend(positions)
                continue
            schema_id = HEADER.unpack(header)[1]
            plan = self.plan(schema_id)
            if plan is None:
                result.fallback.extend(positions)
                continue
            group: list[Any] = list(framed) if len(by_header) == 1 else [framed[p] for p in positions]
            good, bad = _read_all(plan, group)  # no None in a group: the header is not None
            raw = pa.Table.from_batches([batch for _, batch in good]) if good else None
            try:
                table = plan.typed(raw) if raw is not None else None
            except _Unfit:
                result.fallback.extend(positions)
                continue
            result.fallback.extend(positions[index] for index in bad)
            if table is not None and raw is not None:
                kept = positions if not bad else [positions[index] for indices, _ in good for index in indices.tolist()]
                form = plan.json_form(raw) if json_forms else None
                result.groups[schema_id] = SchemaColumns(schema_id, kept, table, plan.column_types, plan.is_envelope,
                                                         form)
        result.tombstones.sort()
        result.fallback.sort()
        return result


@dataclass
class _Part:
    """Records [start, end) of a chunk to read. `fails`: known to fail (not read). `second`: the other
    half of the same split, known to fail once this first half reads whole (the failure of the two
    lies in it). `scan`: may be scanned with the reference reader."""

    start: int
    end: int
    fails: bool = False
    second: _Part | None = None
    scan: bool = True


def _split_failed(plan: _Plan, framed: list[bytes], part: _Part, ranges: list[_Part], bad: list[int]) -> None:
    """Queue what is left to read of a failed part (first parts last: the queue is popped from its end)."""
    start, end = part.start, part.end
    if end - start == 1:
        bad.append(start)
        return
    if part.scan and end - start <= LOCATE:
        found = plan.refused(framed, start, end)
        if found is not None:
            bad.append(found)
            ranges += [_Part(a, b) for a, b in ((found + 1, end), (start, found)) if a < b]
            return
    middle = (start + end) // 2
    second = _Part(middle, end, scan=part.scan and end - start > LOCATE)
    ranges += [second, _Part(start, middle, second=second, scan=second.scan)]


def _read_all(plan: _Plan, framed: list[bytes]) -> tuple[list[tuple[np.ndarray, pa.RecordBatch]], list[int]]:
    """(indices, batch) of the records read in bulk, in order, and the indices that were not: records
    the reader refuses, records whose sentinel moved (their body ends early or late) and records with
    a union index outside their union. The reads' raw batches are joined and their unions checked once
    (`nullable` costs about as much for one record as for thousands).

    The reader cannot say which record it failed on, nor give the records before it (a read is one
    batch: see the module docstring), and every read costs about 2 ms whatever its size. So a failed
    read is halved, and the second half is not read when the first reads (it holds the failure); a
    failed part of at most `LOCATE` records is scanned with the reference reader, and the records on
    either side of the one it refuses are read again in bulk. One bad record in 5,000 costs about nine
    more reads and a scan of a few hundred records (splitting in eight parts down to the record took 33)."""
    sentinel = _sentinel()
    raw: list[tuple[int, pa.RecordBatch]] = []
    bad: list[int] = []
    ranges = [_Part(0, len(framed))]
    while ranges:
        part = ranges.pop()
        start, end = part.start, part.end
        failed = part.fails
        if not failed:
            try:
                batch, shifted = plan.read(framed[start:end], sentinel)
            except BaseException as exc:  # noqa: BLE001 - the Rust reader raises its own errors and panics
                if isinstance(exc, _SKIP_EXCEPTIONS):
                    raise
                failed = True
        if failed:
            _split_failed(plan, framed, part, ranges, bad)
            continue
        if shifted is None and part.second is not None:
            part.second.fails = True  # the first half read whole: the failure of the split is in the second
        read = end - start if shifted is None else shifted  # rows before the first moved sentinel
        if shifted is not None:
            bad.append(start + shifted)
            if start + shifted + 1 < end:
                ranges.append(_Part(start + shifted + 1, end))
        if read:
            raw.append((start, batch.slice(0, read)))
    if not raw:
        return [], sorted(bad)
    raw.sort(key=lambda item: item[0])
    indices = np.concatenate([np.arange(start, start + rows.num_rows) for start, rows in raw])
    joined = raw[0][1] if len(raw) == 1 else pa.Table.from_batches([rows for _, rows in raw]).combine_chunks(
        ).to_batches()[0]
    try:
        batch, misread = plan.nullable(joined)
    except BaseException as exc:  # noqa: BLE001 - as the reader's own errors: every record the reference way
        if isinstance(exc, _SKIP_EXCEPTIONS):
            raise
        return [], sorted(bad + indices.tolist())
    if misread.any():
        bad.extend(indices[misread].tolist())
        batch, indices = batch.filter(pa.array(~misread)), indices[~misread]
    bad.sort()
    return ([(indices, batch)] if len(indices) else []), bad


def decode_avro_columns(framed: Sequence[bytes | None], client: SchemaRegistryClient | ConfluentAvroDecoder
                        ) -> BulkDecoded:
    """`BulkAvroDecoder(client).decode(framed)`; keep a `BulkAvroDecoder` to reuse its plans."""
    return BulkAvroDecoder(client).decode(framed)

