"""One Kafka partition's offset range -> its net changes as typed Arrow, on the executor.

The plain path (no materializer, no stateful FROM_CHANGELOG) reduces where it reads: the
records of a range are decoded (`ChangelogBatchDecoder`), reduced to the last change per
primary key in source order (offset, change_index) as they arrive, and the survivors' row
images are converted once to typed columns. Debezium keys its topics by primary key, so a
key's changes sit in one partition and this is nearly all of the batch's reduction; the
driver only merges the ranges (`batch_changes`).

What a range sends to the driver is its payload (`materialize.payload`): a few Arrow IPC
streams, not a row per change.

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

import pyarrow as pa
import pyarrow.compute as pc

from connectors.delta.arrow_types import (
    merge_types,
)
from connectors.kafka.range_reader import ValueChunk
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder
from service.kafka_to_delta.formats.debezium_json import loads
from service.kafka_to_delta.formats.row_fit import BARE_MISFIT, TypedRows
from service.kafka_to_delta.materialize.fill_unchanged import filled_images
from service.kafka_to_delta.materialize.last_change import last_rows
from service.kafka_to_delta.materialize.payload import (
    RETRACTIONS,
    TRUNCATE,
    TypeEvidence,
    payload_batch,
    typed_changes,
)
from service.kafka_to_delta.rows.names import FAILED_COLUMNS, Column, Meta
from service.kafka_to_delta.rows.payload_spool import PayloadSpool
from service.kafka_to_delta.source.debezium_columns import RangeColumns, decode_range
from service.kafka_to_delta.source.envelope_rows import meta_columns, typed_net
from service.kafka_to_delta.source.history_rows import (
    HistoryColumns,
    changelog_history,
    history_plan,
    sequence_path,
)
from service.kafka_to_delta.source.range_state import GROUP_COLUMN, KEY_COLUMN
from service.kafka_to_delta.source.vector_plan import NotVectorisable, VectorPlan, vector_plan
from service.kafka_to_delta.source.wrapper_layouts import BARE
from vocabulary.changes import ChangeKind

__all__ = ["PartitionReducer"]
_IMAGE_KINDS = (ChangeKind.INSERT.value, ChangeKind.UPDATE_BEFORE.value, ChangeKind.UPDATE_AFTER.value)


@dataclass
class _Reduced:
    """The net changelog rows of the records seen so far, and what else they held."""

    net: pa.Table | None = None
    failed: list[pa.Table] = field(default_factory=list)
    truncate_offset: int | None = None
    changes: int = 0
    every: list[pa.Table] | None = None
    """Every changelog row, kept for a history table (None: not kept)."""

    def add(self, changelog: pa.Table) -> None:
        self.changes += changelog.num_rows
        if self.every is not None:
            self.every.append(changelog)
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
    bare = net.filter(pc.and_(pc.is_null(texts), pc.invert(pc.is_in(net.column(Column.KIND), pa.array(RETRACTIONS)))))
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
    way it went, `fallback` why). `spool`: where the payloads are handed over in files (`rows.payload_spool`,
    written straight from the tables' buffers, uncompressed); without one they cross the JVM in their
    cells, LZ4-compressed (`rows.ipc`).
    """

    def __init__(self, decoder: ChangelogBatchDecoder, primary_key: tuple[str, ...], vectorised: bool = True,
                 history: tuple[str, ...] = (), spool: PayloadSpool | None = None) -> None:
        self.decoder = decoder
        self.primary_key = primary_key
        self.spool = spool
        self.history = sequence_path(history) if history else None
        if not vectorised:
            self.plan = None
        else:
            self.plan = history_plan(decoder, primary_key) if history else vector_plan(decoder, primary_key)

    def __call__(self, read: Callable[[], Iterable[pa.RecordBatch]],
                 read_values: Callable[[], Iterable[ValueChunk]] | None = None) -> Iterator[pa.RecordBatch]:
        """The payload of the range `read` yields; `read_values` yields its values alone (cheaper
        to read, all the vectorised decode needs)."""
        fallback = None
        if self.plan is not None:
            chunks = read_values() if read_values is not None else map(ValueChunk.of_batch, read())
            try:
                columns = self._decoded(self.plan, chunks)
                yield from self._vectorised(columns, read)
                return
            except NotVectorisable as exc:
                fallback = str(exc)
        reduced = self._reduced(read, None)
        range_types = _unfit_range_types(reduced.surviving())
        if range_types is not None:  # a record without types misfits what others declare: reject it, read again
            reduced = self._reduced(read, range_types)
        info: dict[str, Any] = {"vectorised": False}
        if fallback is not None:
            info["fallback"] = fallback
        yield self._payload(reduced, info)

    def _decoded(self, plan: VectorPlan, chunks: Iterable[ValueChunk]) -> RangeColumns:
        if self.history is None:
            return decode_range(plan, self.decoder.decode_value, chunks)
        columns = HistoryColumns(plan, self.decoder.decode_value, sequence=self.history)
        for chunk in chunks:
            columns.add(chunk)
        return columns

    def _payload(self, reduced: _Reduced, info: dict[str, Any]) -> pa.RecordBatch:
        net = reduced.surviving()
        info = {"changes": reduced.changes, "truncated": reduced.truncate_offset is not None, **info}
        typed = None
        if net is not None and net.num_rows:
            typed, evidence = typed_changes(net, self.primary_key)
            info["types"] = evidence.to_json()
        history = None
        if reduced.every:
            history = changelog_history(pa.concat_tables(reduced.every), self.primary_key)
        return payload_batch(typed, reduced.failed, info, history, self.spool)

    def _reduced(self, read: Callable[[], Iterable[pa.RecordBatch]], range_types: dict[str, str] | None,
                 offsets: pa.Array | None = None) -> _Reduced:
        """The range's records (those at `offsets` only, when given) decoded record by record."""
        reduced = _Reduced(every=[] if self.history is not None else None)
        for batch in read():
            if offsets is not None:
                batch = batch.filter(pc.is_in(batch.column(Column.OFFSET), value_set=offsets))
                if not batch.num_rows:
                    continue
            reduced.add(pa.Table.from_batches([self.decoder(batch, range_types)]))
        return reduced

    def _vectorised(self, columns: RangeColumns, read: Callable[[], Iterable[pa.RecordBatch]]
                    ) -> Iterator[pa.RecordBatch]:
        """The payload of the records decoded in Arrow; then, when some were left to the
        record-by-record way, theirs: the driver merges the two by key in source order, and a
        TRUNCATE among them is applied to both (`truncates`)."""
        net, declared, seen = columns.result(self.primary_key)
        odd = None
        if columns.odd:
            odd = self._reduced(read, None, pa.array(columns.odd, pa.int64()))
            self._check_apart(columns, net, declared, odd)
        extra = {"odd_records": len(columns.odd)} if odd is not None else {}
        history = columns.history(self.primary_key) if isinstance(columns, HistoryColumns) else None
        yield self._arrow_payload(columns, net, declared, seen, extra, history)
        if odd is not None:
            marker = {}
            if odd.truncate_offset is not None:
                marker["truncates"] = [[columns.topic, columns.partition, odd.truncate_offset]]
            yield self._payload(odd, marker)

    def vectorised_payload(self, columns: RangeColumns) -> pa.RecordBatch:
        """The payload of records every one of which was decoded in Arrow (`columns.odd` empty): of one
        range, or of several ranges of one topic decoded as one chunk (`range_reader.joined_chunk`)."""
        if columns.odd:
            raise ValueError("records left to the record-by-record way need their range read again")
        return self._arrow_payload(columns, *columns.result(self.primary_key), {})

    def _arrow_payload(self, columns: RangeColumns, net: pa.Table | None, declared: dict[str, str],
                       seen: dict[str, set[str]], extra: dict[str, Any],
                       history: tuple[pa.Table, TypeEvidence] | None = None) -> pa.RecordBatch:
        info: dict[str, Any] = {"changes": columns.changes, "truncated": False, "vectorised": True, **extra}
        typed = None
        if net is not None:
            evidence = TypeEvidence(declared, seen)
            typed = typed_net(net, evidence.types(), self.primary_key)
            meta = meta_columns(net)
            for name in Meta.ALL:
                typed = typed.append_column(name, meta[_META_ROLES[name]])
            info["types"] = evidence.to_json()
        return payload_batch(typed, [], info, history, self.spool)

    @staticmethod
    def _check_apart(columns: RangeColumns, net: pa.Table | None, declared: dict[str, str], odd: _Reduced) -> None:
        """Raise `NotVectorisable` where decoding the odd records apart could differ from decoding
        the range as one: a key with changes on both sides next to placeholders (a fill would
        cross them), or records with and without column types on different sides (a misfit is
        judged within a range)."""
        odd_net = odd.surviving()
        if odd_net is None or net is None or not odd_net.num_rows or not net.num_rows:
            return
        placeholders = columns.held or pc.any(pc.is_valid(odd_net.column(Column.UNCHANGED))).as_py()
        if placeholders and pc.any(pc.is_in(odd_net.column(Column.KEY), value_set=net.column(KEY_COLUMN))).as_py():
            raise NotVectorisable("a key's changes on both ways next to unavailable-value placeholders")
        odd_types = odd_net.column(Column.TYPES)
        bulk_bare = pc.any(pc.equal(net.column(GROUP_COLUMN), BARE)).as_py()
        if (declared and odd_types.null_count) or (bulk_bare and odd_types.null_count < odd_net.num_rows):
            raise NotVectorisable("odd records with and without column types apart from the others")


_META_ROLES = {Meta.KEY: "key", Meta.KIND: "kind", Meta.TOPIC: "topic", Meta.PARTITION: "partition",
               Meta.OFFSET: "offset", Meta.CHANGE_INDEX: "change_index", Meta.TIMESTAMP: "timestamp",
               Meta.UNCHANGED: "unchanged"}
