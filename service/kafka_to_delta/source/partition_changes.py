"""One Kafka partition's offset range -> its net changes as typed Arrow, on the executor.

The plain path (no materializer, no stateful FROM_CHANGELOG) reduces where it reads: the
records of a range are decoded (`ChangelogBatchDecoder`), reduced to the last change per
primary key in source order (offset, change_index) as they arrive, and the survivors' row
images are converted once to typed columns. Debezium keys its topics by primary key, so a
key's changes sit in one partition and this is nearly all of the batch's reduction; the
driver only merges the ranges (`batch_changes`).

What a range sends to the driver is a few Arrow IPC streams (`PAYLOAD_SCHEMA`), not a row
per change: part `changes` (typed net changes with the `Meta` columns; its schema metadata
holds the types the rows declared, the kinds the data suggested and the counts) and part
`failed` (records that could not become changes, with their policy and original bytes).

Rules, as the per-batch reduction has always had them: a retraction (-U, -D) as the last
change deletes the key; a TRUNCATE in the range wipes the range's earlier changes; a last
change that left columns unchanged (TOAST) is filled from the key's earlier images of the
range, from its last complete one on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.delta.arrow_types import (
    inferred_kinds,
    merge_types,
    rows_to_table,
    types_from_kinds,
)
from connectors.kafka.range_reader import ValueChunk
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder
from service.kafka_to_delta.formats.debezium_columns import (
    NotVectorisable,
    decode_range,
    meta_columns,
    typed_net,
    vector_plan,
)
from service.kafka_to_delta.formats.debezium_json import JsonDocuments, loads
from service.kafka_to_delta.formats.row_fit import BARE_MISFIT, TypedRows, misfit
from service.kafka_to_delta.materialize.fill_unchanged import filled_images, filled_net
from service.kafka_to_delta.materialize.last_change import last_rows
from service.kafka_to_delta.materialize.net_changes import unpack_net
from service.kafka_to_delta.rows.arrow import PAYLOAD_SCHEMA
from service.kafka_to_delta.rows.ipc import ipc_bytes
from service.kafka_to_delta.rows.names import COUNTERS, FAILED_COLUMNS, Column, Meta, Part
from vocabulary.changes import ChangeKind
from vocabulary.errors import DecodeError, SourceCoordinates

TRUNCATE = "TRUNCATE"
__all__ = ["NetPayload", "PartitionReducer", "net_payload"]
_META_KEY = b"cdc-lakehouse"
_IMAGE_KINDS = (ChangeKind.INSERT.value, ChangeKind.UPDATE_BEFORE.value, ChangeKind.UPDATE_AFTER.value)
_RETRACTIONS = (ChangeKind.UPDATE_BEFORE.value, ChangeKind.DELETE.value)

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


@dataclass
class _Reduced:
    """The net changelog rows of the records seen so far, and what else they held."""

    net: pa.Table | None = None
    failed: list[pa.Table] = field(default_factory=list)
    truncate_offset: int | None = None
    changes: int = 0

    def add(self, changelog: pa.Table) -> None:
        self.changes += changelog.num_rows
        failed = changelog.filter(pc.is_valid(changelog.column(Column.ERROR)))
        if failed.num_rows:
            self.failed.append(failed.select(list(FAILED_COLUMNS)))
        kind = changelog.column(Column.KIND)
        truncates = changelog.filter(pc.equal(kind, TRUNCATE))
        if truncates.num_rows:
            self.truncate_offset = max(self.truncate_offset or -1, pc.max(truncates.column(Column.OFFSET)).as_py())
        changes = changelog.filter(pc.and_(pc.is_valid(kind), pc.not_equal(kind, TRUNCATE)))
        if self.net is not None:
            changes = pa.concat_tables([self.net, changes])
        self.net = filled_images(last_rows(changes, Column.KEY), changes)

    def surviving(self) -> pa.Table | None:
        """The net rows a TRUNCATE of the range did not wipe."""
        if self.net is None or self.truncate_offset is None:
            return self.net
        return self.net.filter(pc.greater(self.net.column(Column.OFFSET), self.truncate_offset))


def typed_changes(net: pa.Table, primary_key: tuple[str, ...]) -> tuple[pa.Table, TypeEvidence]:
    """Net changelog rows (JSON row images) -> typed rows plus `Meta` columns, and their type evidence.

    A delete carries its primary key only (from the key), an upsert its whole image.
    """
    deletes = pc.is_in(net.column(Column.KIND), pa.array(_RETRACTIONS)).to_pylist()
    rows = [
        dict(zip(primary_key, loads(key.encode()))) if deleted or text is None else loads(text.encode())
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
    typed = _table_or_located(rows, evidence.types(), net)
    kinds = pa.array([ChangeKind.DELETE.value if d else ChangeKind.UPDATE_AFTER.value for d in deletes], pa.string())
    meta = {name: net.column(source) for name, source in Meta.SOURCE.items()}
    meta[Meta.KIND] = kinds
    for name in Meta.ALL:
        typed = typed.append_column(name, meta[name])
    return typed, evidence


def payload_table(payload: bytes) -> tuple[pa.Table, dict]:
    """A payload's table and the metadata its range attached."""
    table = pa.ipc.open_stream(payload).read_all()
    meta = (table.schema.metadata or {}).get(_META_KEY)
    return table, json.loads(meta) if meta else {}


def _payload(typed: pa.Table | None, failed: list[pa.Table], info: dict) -> pa.RecordBatch:
    """One range's (or one Spark partition's) payload rows."""
    parts, payloads = [Part.CHANGES], []
    changes = typed if typed is not None else pa.table({})
    payloads.append(ipc_bytes(changes.replace_schema_metadata({_META_KEY: json.dumps(info).encode()})))
    if failed:
        parts.append(Part.FAILED)
        payloads.append(ipc_bytes(pa.concat_tables(failed)))
    return pa.RecordBatch.from_arrays([pa.array(parts, pa.string()), pa.array(payloads, pa.binary())],
                                      schema=PAYLOAD_SCHEMA)


"""Materializer counters a stateful path's net rows carry; summed into the payload's metadata."""


def net_payload(net: pa.Table, primary_key: tuple[str, ...]) -> pa.RecordBatch | None:
    """The payload rows of net rows after a stateful stage (`net_changes.NET_SCHEMA`, at most one per
    primary key across the whole batch), typed where they are; None when there are none."""
    if net.num_rows == 0:
        return None
    info: dict[str, Any] = {"changes": int(pc.sum(net.column("changes")).as_py() or 0), "truncated": False,
                            "counters": {c: int(pc.sum(net.column(c)).as_py() or 0) for c in COUNTERS}}
    failed = net.filter(pc.is_valid(net.column(Column.ERROR)))
    kind = net.column(Column.KIND)
    truncates = net.filter(pc.equal(kind, TRUNCATE)).select([Column.TOPIC, Column.PARTITION, Column.OFFSET])
    if truncates.num_rows:  # applied on the driver: a marker and the changes it wipes may be apart here
        info["truncated"] = True
        info["truncates"] = [list(row.values()) for row in truncates.to_pylist()]
    changes = filled_net(net.filter(pc.and_(pc.is_valid(kind), pc.not_equal(kind, TRUNCATE))))
    typed = None
    if changes.num_rows:
        changes = changes.append_column(Column.CHANGE_INDEX, pa.array(np.zeros(changes.num_rows, np.int32)))
        typed, evidence = typed_changes(changes, primary_key)
        info["types"] = evidence.to_json()
    kept = [failed.select([c for c in FAILED_COLUMNS])] if failed.num_rows else []
    return _payload(typed, kept, info)


class NetPayload:
    """The `mapInArrow` function after a stateful stage that emits net rows (`net_payload` of a whole
    Spark partition). Picklable."""

    def __init__(self, primary_key: tuple[str, ...]) -> None:
        self.primary_key = primary_key

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
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


def _unfit_range_types(net: pa.Table | None) -> dict[str, str] | None:
    """The column types a range's records declare, when a surviving upsert of a record that declares
    none does not fit them (a whole-range conversion would fail on it); else None."""
    if net is None or net.num_rows == 0:
        return None
    texts = net.column(Column.TYPES)
    if texts.null_count in (0, net.num_rows):
        return None
    declared: dict[str, str] = {}
    for text in pc.unique(texts.drop_null()).to_pylist():
        declared = merge_types(declared, json.loads(text))
    bare = net.filter(pc.and_(pc.is_null(texts), pc.invert(pc.is_in(net.column(Column.KIND), pa.array(_RETRACTIONS)))))
    checked = TypedRows()
    for index, text in enumerate(bare.column(Column.ROW).to_pylist()):
        if text is not None:
            checked.add(index, [loads(text.encode())], declared, BARE_MISFIT)
    return declared if checked.misfits() else None


class PartitionReducer:
    """One Kafka range's record batches -> its payload (`PAYLOAD_SCHEMA`). Picklable.

    Called with `read`, which yields the range's record batches (`RAW_SCHEMA`) each time it is
    called. Debezium JSON envelopes are decoded in Arrow (`debezium_columns`) when the settings
    allow; a range holding anything that path does not vouch for is read again and decoded
    record by record, which decides errors and policies (the payload's `vectorised` says which
    way it went, `fallback` why).
    """

    def __init__(self, decoder: ChangelogBatchDecoder, primary_key: tuple[str, ...], vectorised: bool = True) -> None:
        self.decoder = decoder
        self.primary_key = primary_key
        self.plan = vector_plan(decoder, primary_key) if vectorised else None

    def __call__(self, read: Callable[[], Iterable[pa.RecordBatch]],
                 read_values: Callable[[], Iterable[ValueChunk]] | None = None) -> Iterator[pa.RecordBatch]:
        """The payload of the range `read` yields; `read_values` yields its values alone (cheaper
        to read, all the vectorised decode needs)."""
        fallback = None
        if self.plan is not None:
            chunks = read_values() if read_values is not None else map(ValueChunk.of_batch, read())
            try:
                yield self._vectorised(chunks)
                return
            except NotVectorisable as exc:
                fallback = str(exc)
        reduced = self._reduced(read, None)
        range_types = _unfit_range_types(reduced.surviving())
        if range_types is not None:  # a record without types misfits what others declare: reject it, read again
            reduced = self._reduced(read, range_types)
        net = reduced.surviving()
        info: dict[str, Any] = {"changes": reduced.changes, "truncated": reduced.truncate_offset is not None,
                                "vectorised": False}
        if fallback is not None:
            info["fallback"] = fallback
        typed = None
        if net is not None and net.num_rows:
            typed, evidence = typed_changes(net, self.primary_key)
            info["types"] = evidence.to_json()
        yield _payload(typed, reduced.failed, info)

    def _reduced(self, read: Callable[[], Iterable[pa.RecordBatch]], range_types: dict[str, str] | None) -> _Reduced:
        reduced = _Reduced()
        for batch in read():
            reduced.add(pa.Table.from_batches([self.decoder(batch, range_types)]))
        return reduced

    def _vectorised(self, chunks: Iterable[ValueChunk]) -> pa.RecordBatch:
        assert self.plan is not None and isinstance(self.decoder.decode_value, JsonDocuments)
        columns = decode_range(self.plan, self.decoder.decode_value, chunks)
        net, declared, seen = columns.result(self.primary_key)
        info: dict[str, Any] = {"changes": columns.changes, "truncated": False, "vectorised": True}
        typed = None
        if net is not None:
            evidence = TypeEvidence(declared, seen)
            typed = typed_net(net, evidence.types(), self.primary_key)
            meta = meta_columns(net)
            for name in Meta.ALL:
                typed = typed.append_column(name, meta[_META_ROLES[name]])
            info["types"] = evidence.to_json()
        return _payload(typed, [], info)


_META_ROLES = {Meta.KEY: "key", Meta.KIND: "kind", Meta.TOPIC: "topic", Meta.PARTITION: "partition",
               Meta.OFFSET: "offset", Meta.CHANGE_INDEX: "change_index", Meta.TIMESTAMP: "timestamp",
               Meta.UNCHANGED: "unchanged"}
