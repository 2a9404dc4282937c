"""A micro-batch's range payloads (`partition_changes`) -> its net changes, typed, on the driver.

Each Kafka range arrives already reduced and typed; here the ranges are only merged, all in
Arrow: the column types of the whole batch are decided from every range's evidence (declared
types win, the data types the rest, as for one range), a range whose rows were typed
differently is cast, and a key present in several ranges keeps its last change in source
order (topic, partition, offset, change_index).

Shortcut: a change that left columns unchanged is filled from earlier images of its own range
only; a key whose changes are spread over several partitions (a producer not keying by
primary key) is not filled across them, and the sink keeps the stored value instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from connectors.delta.arrow_types import arrow_type, typed_column
from service.kafka_to_delta.changelog_batch import CHANGELOG_SCHEMA
from service.kafka_to_delta.last_change import last_rows
from service.kafka_to_delta.partition_changes import (
    FAILED_COLUMNS,
    Meta,
    Part,
    TypeEvidence,
    payload_table,
)


@dataclass(frozen=True)
class BatchChanges:
    """One micro-batch, ready for the sink."""

    changes: pa.Table
    """One row per key: the row's typed columns (`types` order), then the `Meta` columns."""
    failed: pa.Table
    """Records that could not become changes (`FAILED_COLUMNS`), each with its policy."""
    truncated: bool
    """A source TRUNCATE was read: stored rows the batch does not upsert are deleted."""
    count: int
    """Changelog rows read (changes, markers and failed records)."""
    counters: dict[str, int]
    """Materializer counters (conflicts, rollbacks, ...), summed; empty without a materializer."""
    fallbacks: list[str]
    """Why each range that the vectorised decode gave back was decoded record by record."""
    vectorised: int = 0
    """Ranges of the plain path decoded in Arrow (`debezium_columns`)."""
    record_by_record: int = 0
    """Ranges of the plain path decoded record by record (settings it does not take, or given back)."""


def _conformed(table: pa.Table, types: dict[str, str]) -> pa.Table:
    """A range's table with exactly the batch's columns and types, then the `Meta` columns."""
    arrays, fields = [], []
    for name, type_name in types.items():
        target = arrow_type(type_name)
        if name not in table.column_names:
            column = pa.nulls(table.num_rows, target)
        else:
            column = table.column(name)
            if column.type != target:
                try:
                    column = column.cast(target)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    column = typed_column(name, type_name, column.to_pylist())
        arrays.append(column)
        fields.append(pa.field(name, target))
    for name in Meta.ALL:
        arrays.append(table.column(name))
        fields.append(table.schema.field(name))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def without_truncated(changes: pa.Table, truncates: list[tuple[str, int, int]]) -> pa.Table:
    """The changes a source TRUNCATE does not wipe: those after it in its topic partition (changes
    in other partitions have no order relative to it and apply after it)."""
    cuts: dict[tuple[str, int], int] = {}
    for topic, partition, offset in truncates:
        cuts[(topic, partition)] = max(cuts.get((topic, partition), -1), offset)
    for (topic, partition), offset in cuts.items():
        wiped = pc.and_(pc.and_(pc.equal(changes.column(Meta.TOPIC), topic),
                                pc.equal(changes.column(Meta.PARTITION), partition)),
                        pc.less_equal(changes.column(Meta.OFFSET), offset))
        changes = changes.filter(pc.invert(wiped))
    return changes


def _empty_failed() -> pa.Table:
    return pa.schema([CHANGELOG_SCHEMA.field(name) for name in FAILED_COLUMNS]).empty_table()


def batch_changes(payloads: pa.Table) -> BatchChanges:
    """Merge the payloads (`PAYLOAD_SCHEMA` rows) of one micro-batch."""
    ranges: list[pa.Table] = []
    failed: list[pa.Table] = []
    evidence = TypeEvidence()
    truncated, count = False, 0
    counters: dict[str, int] = {}
    truncates: list[tuple[str, int, int]] = []
    fallbacks: list[str] = []
    vectorised = record_by_record = 0
    for part, payload in zip(payloads.column("part").to_pylist(), payloads.column("payload").to_pylist()):
        table, info = payload_table(payload)
        if part == Part.FAILED:
            failed.append(table)
            continue
        count += info.get("changes", 0)
        vectorised += info.get("vectorised") is True
        record_by_record += info.get("vectorised") is False  # absent after a stateful stage
        if "fallback" in info:
            fallbacks.append(info["fallback"])
        truncated = truncated or info.get("truncated", False)
        truncates.extend(tuple(marker) for marker in info.get("truncates", []))
        for name, value in info.get("counters", {}).items():
            counters[name] = counters.get(name, 0) + value
        if table.num_rows:
            ranges.append(table)
            evidence.add(TypeEvidence.from_json(info["types"]))
    types = evidence.types()
    changes = pa.table({})
    if ranges:
        changes = pa.concat_tables([_conformed(table, types) for table in ranges])
        if len(ranges) > 1:
            ordered = changes.sort_by([(name, "ascending") for name in Meta.ORDER])
            changes = last_rows(ordered, Meta.KEY)
        changes = without_truncated(changes, truncates)
    return BatchChanges(
        changes=changes,
        failed=pa.concat_tables(failed) if failed else _empty_failed(),
        truncated=truncated,
        count=count,
        counters=counters,
        fallbacks=fallbacks,
        vectorised=vectorised,
        record_by_record=record_by_record,
    )
