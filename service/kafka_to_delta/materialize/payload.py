"""Net changes -> the payload a range (or a stateful stage) sends to the driver, typed where they are.

A payload is a few Arrow IPC streams (`PAYLOAD_SCHEMA`), not a row per change: part `changes`
(typed net changes with the `Meta` columns; its schema metadata holds the types the rows
declared, the kinds the data suggested and the counts), part `failed` (records that could
not become changes, with their policy and original bytes) and, for a pipeline with a history
table, part `history` (every row change of the range, typed: `source.history_rows`). The
plain path builds it where it reads (`source.partition_changes`), a stateful path after its
last stage (`net_payload`); the driver reads it back (`payload_table`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.delta.arrow_types import (
    arrow_type,
    inferred_kinds,
    merge_types,
    one_array,
    rows_to_table,
    types_from_kinds,
)
from service.kafka_to_delta.formats.debezium_json import COMPACT_SEPARATORS, loads
from service.kafka_to_delta.formats.row_fit import misfit
from service.kafka_to_delta.materialize.fill_unchanged import filled_net
from service.kafka_to_delta.materialize.net_changes import unpack_net
from service.kafka_to_delta.materialize.typed_rows import bulk_kinds, bulk_rows
from service.kafka_to_delta.rows.arrow import PAYLOAD_SCHEMA
from service.kafka_to_delta.rows.ipc import ipc_bytes
from service.kafka_to_delta.rows.names import (
    COUNTERS,
    EARLIER_IMAGES,
    FAILED_COLUMNS,
    TYPED_IMAGE,
    TYPED_PREFIX,
    Column,
    Meta,
    Part,
    typed_names,
)
from service.runtime.worker_heap import task_started
from vocabulary.changes import ChangeKind
from vocabulary.errors import DecodeError, SourceCoordinates

if TYPE_CHECKING:
    from service.kafka_to_delta.rows.payload_spool import PayloadSpool

TRUNCATE = "TRUNCATE"
HISTORY = "history"
"""The `part` of a range's row changes for a history table (`source.history_rows`), when asked for."""
HISTORY_SEQUENCE = "__cdc_sequence"
"""A history part's column of each change's sequence value (null when it has none)."""
HISTORY_META = (Meta.KEY, Meta.KIND, Meta.TOPIC, Meta.PARTITION, Meta.OFFSET, Meta.CHANGE_INDEX, Meta.UNCHANGED,
                HISTORY_SEQUENCE)
"""The columns of a history part after the row's own: `Meta`'s source columns, the change's kind (+U an
upsert, -U an update's before image, -D a delete) and its sequence value."""
_META_KEY = b"cdc-lakehouse"
RETRACTIONS = (ChangeKind.UPDATE_BEFORE.value, ChangeKind.DELETE.value)
BULK_ROWS = 256
"""Net rows typed in bulk at least: the bulk way costs about 7 ms a call whatever its size (a parse and a
few dozen Arrow kernels), the reference 45-60 us a row on a captured table's rows, so the two meet at
about 225 rows (`bench/net_rows_typing.py --records 3000`)."""


@dataclass
class TypeEvidence:
    """What a set of net rows says about column types: declared (schema blocks, Avro) and seen."""

    declared: dict[str, str] = field(default_factory=dict)
    seen: dict[str, set[str]] = field(default_factory=dict)

    def add(self, other: "TypeEvidence") -> None:
        """Fold in another range's evidence (its declared types widen, its kinds union)."""
        self.declared = merge_types(self.declared, other.declared)
        for column, kinds in other.seen.items():
            self.seen.setdefault(column, set()).update(kinds)

    def types(self) -> dict[str, str]:
        """Column types: declared ones win, the data types the rest."""
        inferred = types_from_kinds(self.seen)
        return {**self.declared, **{c: kind for c, kind in inferred.items() if c not in self.declared}}

    def to_json(self) -> dict:
        return {"declared": self.declared, "seen": {c: sorted(k) for c, k in self.seen.items()}}

    @classmethod
    def from_json(cls, data: dict) -> "TypeEvidence":
        return cls(dict(data["declared"]), {c: set(k) for c, k in data["seen"].items()})



def typed_changes(net: pa.Table, primary_key: tuple[str, ...]) -> tuple[pa.Table, TypeEvidence]:
    """Net changelog rows (JSON row images) -> typed rows plus `Meta` columns, and their type evidence.

    A delete carries its primary key only (from the key), an upsert its whole image. Rows carrying their
    typed image (`TYPED_IMAGE`, from Avro decoded in bulk) take it (`_carried`). Otherwise, where there are at
    least `BULK_ROWS` rows and they declare one set of column types or none (the kinds of the upserts that
    declare none then inferred in bulk, `typed_rows.bulk_kinds`), the rows are typed in bulk (`typed_rows.bulk_rows`);
    otherwise, and where the bulk way leaves it to the reference, row by row (`rows_to_table`).
    """
    deleting = pc.fill_null(pc.is_in(net.column(Column.KIND), pa.array(RETRACTIONS)), False)
    deletes = deleting.to_pylist()
    carried = _carried(net, primary_key, deletes)
    bulk = _bulk_typed(net, primary_key, deletes) if carried is None and net.num_rows >= BULK_ROWS else None
    if carried is not None:
        typed, evidence = carried
    elif bulk is not None:
        typed, evidence = bulk
    else:
        typed, evidence = _reference_typed(net, primary_key, deletes)
    kinds = pc.if_else(deleting, pa.scalar(ChangeKind.DELETE.value), pa.scalar(ChangeKind.UPDATE_AFTER.value))
    meta = {name: net.column(source) for name, source in Meta.SOURCE.items()}
    meta[Meta.KIND] = kinds
    for name in Meta.ALL:
        typed = typed.append_column(name, meta[name])
    return typed, evidence


def _reference_typed(net: pa.Table, primary_key: tuple[str, ...], deletes: list[bool]) -> tuple[pa.Table, TypeEvidence]:
    rows = [
        _key_row(primary_key, key) if deleted or text is None else loads(text.encode())
        for key, text, deleted in zip(net.column(Column.KEY).to_pylist(), net.column(Column.ROW).to_pylist(), deletes)
    ]
    evidence = TypeEvidence()
    declared: dict[str, dict[str, str]] = {}
    for text in pc.unique(net.column(Column.TYPES).drop_null()).to_pylist():
        declared[text] = json.loads(text)
        evidence.declared = merge_types(evidence.declared, declared[text])
    upserts = [(row, texts) for row, texts, deleted in zip(rows, net.column(Column.TYPES).to_pylist(), deletes)
               if not deleted]
    # Only what no schema declared needs the data to type it (the declared types win anyway).
    undeclared = [row for row, texts in upserts or zip(rows, net.column(Column.TYPES).to_pylist())
                  if texts is None or not row.keys() <= declared[texts].keys()]
    evidence.seen = inferred_kinds(undeclared)
    return _table_or_located(rows, evidence.types(), net), evidence


def _carried(net: pa.Table, primary_key: tuple[str, ...], deletes: list[bool]) -> tuple[pa.Table, TypeEvidence] | None:
    """`_reference_typed`'s result where rows carry their typed image (`TYPED_IMAGE`: the text is the image's,
    written from the same values) and every row declares its column types (then the declared types are
    the evidence): those rows' columns are taken, cast only where another schema version widened a number;
    a delete keeps its primary key. The other rows are typed from their texts with the same types. None where
    that cannot tell the reference's result: a row's key outside the types, a column of another type."""
    if TYPED_IMAGE not in net.column_names or net.column(Column.TYPES).null_count:
        return None
    deleting = np.array(deletes, np.bool_)
    holds = pc.fill_null(net.column(TYPED_IMAGE), False).to_numpy(zero_copy_only=False).astype(np.bool_)
    holds &= deleting | pc.is_valid(net.column(Column.ROW)).to_numpy(zero_copy_only=False)
    if EARLIER_IMAGES in net.column_names:  # filled from earlier images: no longer the carried image
        holds &= pc.is_null(net.column(EARLIER_IMAGES)).to_numpy(zero_copy_only=False)
    if not holds.any():
        return None
    evidence = TypeEvidence()
    for text in pc.unique(net.column(Column.TYPES)).to_pylist():
        evidence.declared = merge_types(evidence.declared, json.loads(text))
    types = evidence.types()
    if not set(primary_key) <= types.keys():
        return None
    every, names = bool(holds.all()), set(net.column_names)
    retracted = pa.array(deleting) if deleting[holds].any() else None
    arrays = []
    for name, type_name in types.items():
        target, source = arrow_type(type_name), TYPED_PREFIX + name
        if source not in names:
            if name in primary_key:
                return None
            arrays.append(pa.nulls(net.num_rows, target))
            continue
        column = net.column(source)
        if column.type != target:
            if not _widened(column.type, target):
                return None
            try:
                column = column.cast(target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return None
        if retracted is not None and name not in primary_key:
            column = pc.if_else(retracted, pa.scalar(None, target), column)
        arrays.append(column)
    schema = pa.schema([(n, arrow_type(t)) for n, t in types.items()])
    if every:
        return pa.Table.from_arrays(arrays, schema=schema), evidence
    # The rows without an image typed from their texts, put in their places (the carried columns copied
    # once, not filtered and put back in order).
    rest = net.drop_columns(typed_names(net.column_names)).filter(pa.array(~holds))
    others = _typed_as(rest, primary_key, deleting[~holds], types)
    if others is None:
        return None
    lacking = pa.array(~holds)
    arrays = [pc.replace_with_mask(one_array(column), lacking, one_array(others.column(index)))
              for index, column in enumerate(arrays)]
    return pa.Table.from_arrays(arrays, schema=schema), evidence


def _widened(carried: pa.DataType, target: pa.DataType) -> bool:
    """Whether `target` is a number type another schema version widened `carried` to (`merge_types`)."""
    if pa.types.is_integer(carried):
        return pa.types.is_integer(target) or pa.types.is_floating(target)
    return pa.types.is_decimal(carried) and pa.types.is_decimal(target)


def _typed_as(net: pa.Table, primary_key: tuple[str, ...], deletes: np.ndarray, types: dict[str, str]) -> pa.Table | None:
    """Rows typed from their texts with `types` (a delete, or a row without text, as its primary key);
    None where a row names a column outside the types it declares (the reference would infer its type)."""
    keys, texts = net.column(Column.KEY).to_pylist(), net.column(Column.ROW).to_pylist()
    keyed = [bool(deleted) or text is None for deleted, text in zip(deletes, texts)]
    declared = pc.unique(net.column(Column.TYPES)).to_pylist()
    if len(texts) >= BULK_ROWS and len(declared) == 1 and json.loads(declared[0]).keys() == types.keys():
        lines = pa.array([_key_text(primary_key, key) if by_key else text
                          for key, text, by_key in zip(keys, texts, keyed)], pa.string())
        return bulk_rows(lines, types)  # None as well where a row names a column outside `types`
    rows = [_key_row(primary_key, key) if by_key else loads(text.encode())
            for key, text, by_key in zip(keys, texts, keyed)]
    names = {text: json.loads(text).keys() for text in declared}
    if any(not isinstance(row, dict) or not row.keys() <= names[text]
           for row, text in zip(rows, net.column(Column.TYPES).to_pylist())):
        return None
    return _table_or_located(rows, types, net)


def _bulk_typed(net: pa.Table, primary_key: tuple[str, ...], deletes: list[bool]) -> tuple[pa.Table, TypeEvidence] | None:
    """`_reference_typed`'s result in bulk, where the rows declare one set of column types or none (JSON
    without schema blocks, or some records with and some without: the kinds of the upserts declaring
    none inferred in bulk, `bulk_kinds`); None where the reference must type the rows."""
    upserting = pa.array(np.logical_not(np.array(deletes, np.bool_)))
    declared_texts = pc.unique(net.column(Column.TYPES).drop_null()).to_pylist()
    upsert_types = net.column(Column.TYPES).filter(upserting)
    if not len(upsert_types) or len(declared_texts) > 1:
        return None
    texts = net.column(Column.ROW).combine_chunks()
    keyed = pc.or_(pa.array(deletes, pa.bool_()), pc.is_null(texts))  # rows that are their primary key only
    if pc.any(keyed).as_py():
        keys = net.column(Column.KEY).filter(keyed).to_pylist()
        texts = pc.replace_with_mask(texts, keyed, pa.array([_key_text(primary_key, key) for key in keys], pa.string()))
    if not declared_texts:
        return _bulk_inferred(texts, deletes)
    evidence = TypeEvidence(declared=merge_types({}, json.loads(declared_texts[0])))
    if upsert_types.null_count:  # some upserts declare no types: the data tells what the declared do not
        inferred = bulk_kinds(texts.filter(pc.and_(upserting, pc.is_null(net.column(Column.TYPES).combine_chunks()))))
        if inferred is None or not inferred.kinds.keys() <= evidence.declared.keys():
            return None  # a column only the data names: the reference tells which rows count as undeclared
        evidence.seen = inferred.kinds
    typed = bulk_rows(texts, evidence.types())  # None as well where a declaring row has a key outside its types
    if typed is None:
        return None
    return typed, evidence


def _bulk_inferred(texts: pa.Array, deletes: list[bool]) -> tuple[pa.Table, TypeEvidence] | None:
    """`_bulk_typed` where no row declares column types: the kinds are inferred from the upserts' texts
    (`bulk_kinds`), whose parse also types them; the deletes' key texts are typed apart, and the rows
    put back in their order."""
    deleting = np.array(deletes, np.bool_)
    upserts = texts.filter(pa.array(~deleting))
    inferred = bulk_kinds(upserts)
    if inferred is None:
        return None
    evidence = TypeEvidence(seen=inferred.kinds)
    typed = bulk_rows(upserts, evidence.types(), inferred.pieces)
    if typed is None:
        return None
    if deleting.any():
        keys = bulk_rows(texts.filter(pa.array(deleting)), evidence.types())
        if keys is None:
            return None
        order = np.empty(len(deleting), np.int64)
        order[~deleting] = np.arange(typed.num_rows)
        order[deleting] = typed.num_rows + np.arange(keys.num_rows)
        typed = pa.concat_tables([typed, keys]).take(pa.array(order))
    return typed, evidence


def _key_row(primary_key: tuple[str, ...], key: str) -> dict:
    return dict(zip(primary_key, loads(key.encode())))


def _key_text(primary_key: tuple[str, ...], key: str) -> str:
    return json.dumps(_key_row(primary_key, key), separators=COMPACT_SEPARATORS)


def payload_table(payload: bytes) -> tuple[pa.Table, dict]:
    """A payload's table and the metadata its range attached."""
    table = pa.ipc.open_stream(payload).read_all()
    meta = (table.schema.metadata or {}).get(_META_KEY)
    return table, json.loads(meta) if meta else {}


def payload_batch(typed: pa.Table | None, failed: list[pa.Table], info: dict,
                  history: tuple[pa.Table, TypeEvidence] | None = None,
                  spool: PayloadSpool | None = None) -> pa.RecordBatch:
    """One range's (or one Spark partition's) payload rows; `history`: its row changes for a history
    table and their type evidence; `spool`: where the payloads are written, each cell its file's reference
    (`rows.payload_spool`; else, or where a write fails, the cells hold the payloads, compressed)."""
    parts, payloads = [Part.CHANGES], []
    changes = typed if typed is not None else pa.table({})
    payloads.append(_cell(changes.replace_schema_metadata({_META_KEY: json.dumps(info).encode()}), spool))
    if failed:
        parts.append(Part.FAILED)
        payloads.append(_cell(pa.concat_tables(failed), spool))
    if history is not None and history[0].num_rows:
        rows, evidence = history
        parts.append(HISTORY)
        payloads.append(_cell(rows.replace_schema_metadata(
            {_META_KEY: json.dumps({"types": evidence.to_json()}).encode()}), spool))
    return pa.RecordBatch.from_arrays([pa.array(parts, pa.string()), pa.array(payloads, pa.binary())],
                                      schema=PAYLOAD_SCHEMA)



def _cell(table: pa.Table, spool: PayloadSpool | None) -> bytes:
    reference = spool.written(table) if spool is not None else None
    return reference if reference is not None else ipc_bytes(table)


def net_payload(net: pa.Table, primary_key: tuple[str, ...]) -> pa.RecordBatch | None:
    """The payload rows of net rows after a stateful stage (`net_changes.NET_SCHEMA`, at most one per
    primary key across the whole batch), typed where they are; None when there are none."""
    if net.num_rows == 0:
        return None
    info: dict[str, Any] = {"changes": int(pc.sum(net.column("changes")).as_py() or 0), "truncated": False,
                            "counters": {c: int(pc.sum(net.column(c)).as_py() or 0) for c in COUNTERS}}
    failed = _rows_where(net, pc.is_valid(net.column(Column.ERROR)))
    kind = net.column(Column.KIND)
    truncates = _rows_where(net, pc.equal(kind, TRUNCATE)).select([Column.TOPIC, Column.PARTITION, Column.OFFSET])
    if truncates.num_rows:  # applied on the driver: a marker and the changes it wipes may be apart here
        info["truncated"] = True
        info["truncates"] = [list(row.values()) for row in truncates.to_pylist()]
    changes = filled_net(_rows_where(net, pc.and_(pc.is_valid(kind), pc.not_equal(kind, TRUNCATE))))
    typed = None
    if changes.num_rows:
        changes = changes.append_column(Column.CHANGE_INDEX, pa.array(np.zeros(changes.num_rows, np.int32)))
        typed, evidence = typed_changes(changes, primary_key)
        info["types"] = evidence.to_json()
    kept = [failed.select([c for c in FAILED_COLUMNS])] if failed.num_rows else []
    return payload_batch(typed, kept, info)


def _rows_where(table: pa.Table, mask: pa.ChunkedArray | pa.Array) -> pa.Table:
    """The rows of `table` where `mask` holds (null: not), without copying the table when it holds
    everywhere or nowhere (the common cases: no failed rows, no truncates)."""
    chosen = pc.sum(pc.fill_null(mask, False)).as_py() or 0
    if chosen == table.num_rows:
        return table
    if chosen == 0:
        return table.slice(0, 0)
    return table.filter(mask, null_selection_behavior="drop")


class NetPayload:
    """The `mapInArrow` function after a stateful stage that emits net rows (`net_payload` of a whole
    Spark partition). Picklable."""

    def __init__(self, primary_key: tuple[str, ...]) -> None:
        self.primary_key = primary_key

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task_started()
        received = list(unpack_net(batches))
        if received:
            payload = net_payload(pa.Table.from_batches(received), self.primary_key)
            if payload is not None:
                yield payload


def _table_or_located(rows: list[dict | None], types: dict[str, str], net: pa.Table) -> pa.Table:
    """`rows_to_table`, or a `DecodeError` naming the first row (of `net`) whose values do not fit
    `types` (a record without column types where others of its range, or of the rows a stateful
    stage compacted, declare them), with no values."""
    try:
        return rows_to_table(rows, types)
    except ValueError as exc:
        reason = str(exc)
        bad = next((i for i, row in enumerate(rows) if misfit([row], types) is not None), None)
        if bad is None:
            raise
        where = net.slice(bad, 1).select([Column.TOPIC, Column.PARTITION, Column.OFFSET, Column.KEY]).to_pylist()[0]
        raise DecodeError(f"a record without column types does not fit those other records declare: {reason}",
                          SourceCoordinates(*where.values())) from None
