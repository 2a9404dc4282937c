"""Vectorised decode of one Kafka range of Debezium envelopes (JSON, or Confluent-framed Avro),
straight to typed net changes.

The plain path's fast way (`partition_changes.PartitionReducer`): instead of parsing, converting
and re-encoding record by record, a batch's values are parsed together by `pyarrow.json` into
typed columns (the row images' types: each Connect schema block's, else inferred by Arrow over
the range), their changelog rows are built as Arrow columns and reduced to the last change per
primary key with a group-by. The values are sorted by their wrapper's bytes first
(`wrapper_layouts`): each schema version of the range is parsed with its own types, and any
JSON layout a producer writes consistently (spaces, key order) is cut open in Arrow.

`RangeColumns` is put together from parts: the settings it takes (`vector_plan`), the state it holds
and the columns of its rows (`range_state`), the screening and parse of one schema version's values
(`version_parse`), the changelog rows of the parsed envelopes and the typing of the net rows
(`envelope_rows`). Here: a chunk split by schema version (JSON) or schema id (Avro), the reduction,
the fill of placeholders and the range's result.

It produces what the record-by-record way does (`typed_changes` of the reduced rows) for every
record it vouches for. A record it cannot vouch for is an odd record (`RangeColumns.odd`): the
caller decodes those alone the record-by-record way, which decides errors, policies and dead
letters, and merges the two by key in source order. Odd records: a value whose wrapper layout
cannot be confirmed; those the parse leaves out (`version_parse`) and those the changelog rows leave
out (`envelope_rows`). Debezium's unavailable-value placeholder (a TOASTed column left unchanged) is taken in
bulk: the column is filled from the key's latest earlier image of the range holding it, else
left to the sink (`unchanged`). A delete ends the key's images: a placeholder after it, with no
image since, stands for null (the row it would keep is gone), as across batches and ranges.

Confluent Avro values (the value decoder is `ConfluentAvroDecoder`) are decoded per schema id by
`connectors.schema_registry.avro_columns` (Arrow's Rust Avro reader, typed columns); each schema
id is a group with its codec's column types and goes through the same changelog, key and
reduction steps. Odd records there: what the bulk reader cannot vouch for (a frame or schema id
it does not take, a body that does not end where the record does, a union index outside its
union, invalid UTF-8, a value its column type does not take), besides the op, image and key
checks (`envelope_rows`). Non-finite doubles become null, as the reference's JSON rows make them.

What still sends the whole range back (`NotVectorisable`), besides what `vector_plan`, `version_parse`
and `envelope_rows` name: a column typed differently by two schema versions or batches in a way Arrow
cannot unify; a key with changes among both the odd records and the others next to placeholders (the
fill would have to cross the two ways).

Decided differences (the parse's own: `version_parse`): a schema-less image with a
column absent (not null) counts as holding null for the placeholder fill, as does an image whose
schema version lacks the column. Columns without a declared type follow the first record of the
range that names them here, the first surviving change that does record by record (a column added
by DDL may come first there); the sink matches columns by name.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import repeat
from operator import is_not
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.delta.arrow_types import binary_array, merge_types
from connectors.kafka.range_reader import ValueChunk
from service.kafka_to_delta.formats.debezium_json import JsonDocuments
from service.kafka_to_delta.materialize.last_change import last_rows
from service.kafka_to_delta.rows.arrow import joined_tables
from service.kafka_to_delta.rows.names import typed_names
from service.kafka_to_delta.source.envelope_rows import EnvelopeRows
from service.kafka_to_delta.source.range_state import (
    _CHANGE_INDEX,
    _FLAG,
    _GROUP,
    _IMAGE,
    _INFERRED_KINDS,
    _KEY,
    _META,
    _OFFSET,
    _PARTITION,
    _RECORD,
    _RETRACT,
    _TIMESTAMP,
    _TOPIC,
    _UNCHANGED,
    TEXT_COLUMNS,
    _mask,
    _shown,
)
from service.kafka_to_delta.source.vector_plan import NotVectorisable, VectorPlan
from service.kafka_to_delta.source.version_parse import VersionParse
from service.kafka_to_delta.source.wrapper_layouts import BARE, ODD, Layout, Layouts

_REDUCE_ROWS = 20_000
"""Changelog rows of a range's chunks reduced together at least (`RangeColumns.reduced`)."""


@dataclass
class RangeColumns(VersionParse, EnvelopeRows):
    """The net changes of one range's batches, decoded and reduced in Arrow (its fields: `range_state.RangeState`)."""

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
            rows, refused = self._group_changes(int(group), binary_array(chosen))
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

    def _conformed(self, rows: pa.Table) -> pa.Table:
        """Rows with the range's row columns in order of first appearance, flags after them."""
        self.order.update(dict.fromkeys(n for n in rows.column_names if n not in _META and n not in TEXT_COLUMNS
                                        and not n.startswith(_FLAG) and n not in typed_names([n])))
        names = [n for n in self.order if n in rows.column_names]
        return rows.select(names + [n for n in rows.column_names if n not in self.order])

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


def decode_range(plan: VectorPlan, documents: JsonDocuments | Any, chunks: Iterable[ValueChunk]) -> RangeColumns:
    """All of a range's chunks folded into one `RangeColumns`; raises `NotVectorisable`."""
    columns = RangeColumns(plan, documents)
    for chunk in chunks:
        columns.add(chunk)
    return columns
