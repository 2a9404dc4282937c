"""A micro-batch's range payloads (`partition_changes`) -> its net changes, typed, on the driver.

Each Kafka range arrives already reduced and typed; here the ranges are only merged, all in
Arrow: the column types of the whole batch are decided from every range's evidence (declared
types win, the data types the rest, as for one range), a range whose rows were typed
differently is cast, and a key present in several ranges keeps its last change in source
order (topic, partition, offset, change_index).

A change that left columns unchanged (TOAST) and was not filled within its range is filled from
the key's latest earlier upsert of another range of the same topic partition holding them (a
partition read in pieces, `fill_across_ranges`). A key whose changes are spread over several
partitions (a producer not keying by primary key) is not filled across them, and the sink keeps
the stored value instead.

That join of the ranges (the last change per key, the fills, a TRUNCATE's cut) may be left to the
commit (`batch_changes(..., join=False)`, `BatchChanges.joined`): a pipeline whose commits run behind
its micro-batches writes the ranges' rows ahead and joins them behind the next micro-batch's stages,
so a partition read in pieces does not hold the next batch back on the driver.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc

from connectors.delta.arrow_types import arrow_type, typed_column
from service.kafka_to_delta.materialize.payload import (
    HISTORY,
    HISTORY_META,
    TypeEvidence,
    payload_table,
)
from service.kafka_to_delta.materialize.payload import HISTORY_SEQUENCE as SEQUENCE
from service.kafka_to_delta.rows.arrow import CHANGELOG_SCHEMA
from service.kafka_to_delta.rows.names import FAILED_COLUMNS, Meta, Part
from service.kafka_to_delta.rows.payload_spool import resolved
from service.kafka_to_delta.source.fill_across_ranges import filled_last_rows
from vocabulary.errors import DecodeError, SourceCoordinates


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
    odd_records: int = 0
    """Records of vectorised ranges left to the record-by-record way (`debezium_columns`)."""
    history: pa.Table | None = None
    """For a history table: every row change of the batch, typed (`history_rows`); None when not asked."""
    truncates: tuple[tuple[str, int, int], ...] | None = None
    """None: `changes` is the batch's net changes. Otherwise `changes` holds the ranges' rows, not yet joined
    (`join_ranges`), and these are the TRUNCATEs read (topic, partition, offset)."""

    def joined(self) -> BatchChanges:
        """The batch with its net changes (itself when they are)."""
        if self.truncates is None:
            return self
        return replace(self, changes=join_ranges(self.changes, list(self.truncates)), truncates=None)


def join_ranges(changes: pa.Table, truncates: list[tuple[str, int, int]]) -> pa.Table:
    """The net changes of a batch's ranges' rows (conformed to one schema): a key in several ranges keeps
    its last change, filled across them; what a TRUNCATE wipes is left out. Keys apart (the bucket stage's
    net rows, ranges of different keys) are their own last changes, with nothing to fill."""
    if changes.num_rows and pc.count_distinct(changes.column(Meta.KEY), mode="all").as_py() < changes.num_rows:
        changes = filled_last_rows(changes)
    return without_truncated(changes, truncates)


def _conformed(table: pa.Table, types: dict[str, str], trailing: tuple[str, ...] = Meta.ALL) -> pa.Table:
    """A range's table with exactly the batch's columns and types, then the `trailing` columns
    (the `Meta` columns, or a history part's `HISTORY_META`)."""
    arrays, fields = [], []
    for name, type_name in types.items():
        target = arrow_type(type_name)
        if name not in table.column_names:
            column = pa.nulls(table.num_rows, target)
        else:
            column = table.column(name)
            if column.type != target and pa.types.is_integer(column.type) and pa.types.is_temporal(target):
                column = _typed_or_located(table, name, type_name)  # epoch counts in the unit the type names
            elif column.type != target:
                try:
                    column = column.cast(target)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    column = _typed_or_located(table, name, type_name)
        arrays.append(column)
        fields.append(pa.field(name, target))
    for name in trailing:
        arrays.append(table.column(name))
        fields.append(table.schema.field(name))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _typed_or_located(table: pa.Table, name: str, type_name: str) -> pa.Array:
    """A range's column converted to the batch's type; a value that does not fit (a record without
    column types in one range, a type declared in another) is a `DecodeError` naming the record.

    Such a record is rejected under `decode_error_handling` when the declaring record is in its own
    Kafka range (`partition_changes`). Across ranges it is found only here, after its range kept
    only the key's last change: skipping it would lose the key's earlier changes of that range, so
    it stops the batch whatever the policy, with its coordinates and no values.
    """
    values = table.column(name).to_pylist()
    try:
        return typed_column(name, type_name, values)
    except ValueError:
        bad = [i for i, value in enumerate(values) if value is not None and not _fits(name, type_name, value)]
        if not bad:
            raise
        first = table.slice(bad[0], 1).select([Meta.TOPIC, Meta.PARTITION, Meta.OFFSET, Meta.KEY]).to_pylist()[0]
        where = SourceCoordinates(first[Meta.TOPIC], first[Meta.PARTITION], first[Meta.OFFSET], first[Meta.KEY])
        more = f"; {len(bad) - 1} more row(s) of the batch alike" if len(bad) > 1 else ""
        raise DecodeError(f"a record without column types does not fit column {name!r} as {type_name}, the type "
                          f"another Kafka range of the micro-batch declares{more}", where) from None


def _fits(name: str, type_name: str, value: object) -> bool:
    try:
        typed_column(name, type_name, [value])
    except ValueError:
        return False
    return True


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


def batch_changes(payloads: pa.Table, join: bool = True) -> BatchChanges:
    """Merge the payloads (`PAYLOAD_SCHEMA` rows) of one micro-batch; without `join`, its ranges' rows are
    left to `BatchChanges.joined`."""
    ranges: list[pa.Table] = []
    failed: list[pa.Table] = []
    evidence = TypeEvidence()
    truncated, count = False, 0
    counters: dict[str, int] = {}
    truncates: list[tuple[str, int, int]] = []
    fallbacks: list[str] = []
    vectorised = record_by_record = odd_records = 0
    history: list[tuple[pa.Table, TypeEvidence]] = []
    for part, payload in zip(payloads.column("part").to_pylist(), payloads.column("payload").to_pylist()):
        table, info = payload_table(resolved(payload))
        if part == Part.FAILED:
            failed.append(table)
            continue
        if part == HISTORY:
            history.append((table, TypeEvidence.from_json(info["types"])))
            continue
        count += info.get("changes", 0)
        vectorised += info.get("vectorised") is True
        record_by_record += info.get("vectorised") is False  # absent after a stateful stage
        odd_records += info.get("odd_records", 0)
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
    left: tuple[tuple[str, int, int], ...] | None = None
    if ranges:
        if len(ranges) > 1:
            changes = pa.concat_tables([_conformed(table, types) for table in ranges])
        else:
            changes = _conformed(ranges[0], types)
        if join:
            changes = join_ranges(changes, truncates)
        else:
            left = tuple(truncates)
    return BatchChanges(
        changes=changes,
        failed=pa.concat_tables(failed) if failed else _empty_failed(),
        truncated=truncated,
        count=count,
        counters=counters,
        fallbacks=fallbacks,
        vectorised=vectorised,
        record_by_record=record_by_record,
        odd_records=odd_records,
        history=batch_history(history) if history else None,
        truncates=left,
    )


def batch_history(parts: list[tuple[pa.Table, TypeEvidence]]) -> pa.Table:
    """The history parts of a batch's ranges as one table: the column types of the batch decided from
    every part's evidence, as for the net changes, each part cast to them."""
    evidence = TypeEvidence()
    for _, found in parts:
        evidence.add(found)
    types = evidence.types()
    tables = [_conformed(table, types, HISTORY_META) for table, _ in parts]
    sequences = [table.column(SEQUENCE) for table in tables]
    sequence_type = pa.unify_schemas([pa.schema([(SEQUENCE, s.type)]) for s in sequences],
                                     promote_options="permissive").field(SEQUENCE).type
    tables = [t.set_column(t.num_columns - 1, pa.field(SEQUENCE, sequence_type), s.cast(sequence_type))
              for t, s in zip(tables, sequences)]
    return pa.concat_tables(tables)
