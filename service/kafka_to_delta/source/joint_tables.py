"""Several tables' small ranges decoded and reduced in one call, keyed by table.

A database source task holds the small ranges of many quiet tables. Decoding each table on its own
(`TableReducers.joined`) pays what a `RangeColumns` call costs (the layout split, one
`pyarrow.json` parse, the changelog columns, the reduction: some 60 Arrow calls) once per table.
Here the records of tables that decode alike are one chunk: one parse, one changelog, one
reduction keyed on table + key (`JointColumns`); the net rows are then split by table and each
table's payload is built from its own rows, as its own decode would have built it.

Which tables go together (`joint_groups`): schema-less Debezium JSON (no Connect wrapper) of one
decoder and primary key, of at most `TABLE_ROWS` records, whose images all hold the same columns in the same order and whose
columns hold values of the same JSON kind (a column null in all of a table's images goes with
any kind). Then the one parse types each column as each table's own parse would, and every table
has the columns and column order its own decode gives. A table goes alone, to the decode of its
own (`TableReducers.joined` or range by range, with their fallbacks), where that is not sure:
a value that is not one JSON object of the envelope's shape, a wrapper, a nested or unparsable
value, the unavailable-value placeholder, settings that mark nulls as unchanged
(`ignore_null_updates`), or a record the Arrow decode leaves to the record-by-record way (found
after the joint decode by its position; the table's errors are then placed by its own ranges).
When the joint decode refuses the chunk as a whole (`NotVectorisable`, an Arrow error), every
table goes alone.

`JointColumns` tags the key where `RangeColumns.add` hands its rows to `_conformed`, just before the
placeholders are tracked and the rows reduced (as `history_rows.HistoryColumns` adds its column there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from connectors.kafka.range_reader import ValueChunk
from service.kafka_to_delta.formats.debezium_json import UNAVAILABLE_VALUE
from service.kafka_to_delta.source.debezium_columns import RangeColumns
from service.kafka_to_delta.source.partition_changes import PartitionReducer
from service.kafka_to_delta.source.range_state import _KEY, _OFFSET, _PARTITION, _TOPIC
from service.kafka_to_delta.source.vector_plan import NotVectorisable, VectorPlan

TABLE_ROWS = 250
"""A table with more records goes alone: past a few hundred records a table's own call costs little more
than its share of a joint one, and the check of its images (`signature`, record by record) costs more."""
CALL_ROWS = 10_000
"""Records per joint call at most: one `pyarrow.json` parse of many more grew slower than the parts."""
_TABLE = "__joint_table"
_OWN_KEY = "__joint_key"
_UNAVAILABLE = UNAVAILABLE_VALUE.encode()
_WRAPPER_FIELDS = ("schema", "payload")
_KINDS = {bool: "bool", int: "int", float: "float", str: "str"}


@dataclass
class TableValues:
    """One table's small ranges as read: its topic, primary key and value chunks in range order."""

    table: str
    topic: str
    primary_key: tuple[str, ...]
    chunks: list[ValueChunk]


@dataclass(frozen=True)
class Signature:
    """The columns every image of a table holds, in order, and each column's JSON kind (None: null
    in every image)."""

    columns: tuple[str, ...]
    kinds: tuple[str | None, ...]

    def joins(self, other: "Signature") -> bool:
        return self.columns == other.columns and all(
            a is None or b is None or a == b for a, b in zip(self.kinds, other.kinds))

    def merged(self, other: "Signature") -> "Signature":
        return Signature(self.columns, tuple(a if a is not None else b for a, b in zip(self.kinds, other.kinds)))


def signature(plan: VectorPlan, chunks: Sequence[ValueChunk]) -> Signature | None:
    """The table's `Signature`, or None: the table is decoded alone (see the module's doc)."""
    columns: tuple[str, ...] | None = None
    kinds: list[set[str]] = []
    for chunk in chunks:
        for value in chunk.values:
            if value is None:  # a tombstone gives nothing either way
                continue
            if _UNAVAILABLE in value:
                return None
            try:
                document = orjson.loads(value)
            except orjson.JSONDecodeError:
                return None
            if not isinstance(document, dict) or any(name in document for name in _WRAPPER_FIELDS):
                return None
            for side in (plan.before, plan.after):
                image = document.get(side)
                if image is None:
                    continue
                if not isinstance(image, dict):
                    return None
                names = tuple(image)
                if columns is None:
                    columns, kinds = names, [set() for _ in names]
                elif names != columns:
                    return None
                for seen, item in zip(kinds, image.values()):
                    if item is not None:
                        kind = _KINDS.get(type(item))
                        if kind is None:  # nested: its inferred type could differ table by table
                            return None
                        seen.add(kind)
    if columns is None:
        return None
    return Signature(columns, tuple(_kind(seen) for seen in kinds))


def _kind(seen: set[str]) -> str | None:
    if not seen:
        return None
    if seen == {"int", "float"}:
        return "float"  # Arrow parses such a column as float64, in a table alone as well
    return next(iter(seen)) if len(seen) == 1 else "mixed"


def joint_groups(plan: VectorPlan, tables: list[TableValues]) -> list[list[TableValues]]:
    """Tables of one decoder and primary key in groups of two or more that decode alike (of up to
    `TABLE_ROWS` records each, `CALL_ROWS` a group); tables not in a group go alone."""
    if any(side is not None and side.nulls_unchanged for sides in plan.codes.values() for side in sides):
        return []
    groups: list[tuple[Signature, list[TableValues], int]] = []
    for table in tables:
        rows = sum(len(chunk.offsets) for chunk in table.chunks)
        if rows > TABLE_ROWS:
            continue
        found = signature(plan, table.chunks)
        if found is None or "mixed" in found.kinds:
            continue
        for index, (shared, members, size) in enumerate(groups):
            if size + rows <= CALL_ROWS and shared.joins(found):
                groups[index] = (shared.merged(found), [*members, table], size + rows)
                break
        else:
            groups.append((found, [table], rows))
    return [members for _, members, _ in groups if len(members) > 1]


@dataclass
class JointColumns(RangeColumns):
    """`RangeColumns` over several tables' records: each record's offset is its position in the joint
    chunk (`owners` gives its table), and the reduction keys on table + key."""

    owners: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Changelog rows per table (a table's `changes`)."""

    def _conformed(self, rows: pa.Table) -> pa.Table:
        rows = super()._conformed(rows)
        owner = self.owners[rows.column(_OFFSET).to_numpy()]
        self.counts += np.bincount(owner, minlength=len(self.counts))
        own_key = rows.column(_KEY)
        tagged = pc.binary_join_element_wise(pa.array(owner.astype(str)), own_key, "|")
        rows = rows.set_column(rows.schema.get_field_index(_KEY), _KEY, tagged)
        return rows.append_column(_TABLE, pa.array(owner, pa.int64())).append_column(_OWN_KEY, own_key)


def decode_together(reducer: PartitionReducer, tables: list[TableValues]
                    ) -> tuple[list[tuple[TableValues, pa.RecordBatch]], list[TableValues]]:
    """(each table's payload, as its own decode gives it; the tables that must go alone)."""
    assert reducer.plan is not None
    values: list[bytes | None] = []
    timestamps: list[int | None] = []
    partitions: list[int] = []
    offsets: list[int] = []
    owners: list[int] = []
    for index, table in enumerate(tables):
        for chunk in table.chunks:
            values.extend(chunk.values)
            timestamps.extend(chunk.timestamps)
            offsets.extend(chunk.offsets)
            partitions.extend(chunk.partitions if chunk.partitions is not None else [chunk.partition] * len(chunk.offsets))
            owners.extend([index] * len(chunk.offsets))
    joint = ValueChunk(tables[0].topic, 0, values, list(range(len(values))), timestamps)
    columns = JointColumns(reducer.plan, reducer.decoder.decode_value, owners=np.asarray(owners, np.int64),
                           counts=np.zeros(len(tables), np.int64))
    try:
        columns.add(joint)
    except (NotVectorisable, pa.ArrowException):  # each table's own decode decides, as before
        return [], tables
    if columns.held or (columns.layouts is not None and columns.layouts.known):
        return [], tables
    alone = set(np.asarray(owners, np.int64)[np.asarray(columns.odd, np.int64)].tolist())
    net = columns.reduced()
    real_partitions = pa.array(partitions, pa.int32())
    real_offsets = pa.array(offsets, pa.int64())
    done, left = [], []
    for index, table in enumerate(tables):
        if index in alone:
            left.append(table)
            continue
        rows = None
        if net is not None and net.num_rows:
            rows = net.filter(pc.equal(net.column(_TABLE), index))
        own = RangeColumns(reducer.plan, reducer.decoder.decode_value, changes=int(columns.counts[index]),
                           topic=table.topic, partition=table.chunks[0].partition, layouts=columns.layouts,
                           order=dict(columns.order), net=_own_rows(rows, table.topic, real_partitions, real_offsets))
        try:
            done.append((table, reducer.vectorised_payload(own)))
        except NotVectorisable:
            left.append(table)
    return done, left


def _own_rows(rows: pa.Table | None, topic: str, partitions: pa.Array, offsets: pa.Array) -> pa.Table | None:
    """A table's net rows as its own decode gives them: its own keys, topic, partitions and offsets."""
    if rows is None or not rows.num_rows:
        return None
    positions = rows.column(_OFFSET)
    names = rows.schema.names
    rows = rows.set_column(names.index(_KEY), _KEY, rows.column(_OWN_KEY))
    rows = rows.set_column(names.index(_TOPIC), _TOPIC, pa.array([topic] * rows.num_rows, pa.string()))
    rows = rows.set_column(names.index(_PARTITION), _PARTITION, partitions.take(positions))
    rows = rows.set_column(names.index(_OFFSET), _OFFSET, offsets.take(positions))
    return rows.drop_columns([_TABLE, _OWN_KEY])
