"""Every row change of a Kafka range, typed in Arrow, for a pipeline's history table (`history:`).

The plain path reduces a range to its net change per key where it reads it; a history needs every
change. When the pipeline has a history, each range's payload carries a second part (`payload.HISTORY`):
its row changes in source order, typed like the net changes (a delete and an update's before image keep
their key only), each with its sequence value (`history.sequence_by`) and source position. The driver
collects it with the net changes (`batch_changes`) and hands it to `sink.history_sink`.

Two ways build the part, as they build the net changes:

- `HistoryColumns`, the vectorised decode (`debezium_columns.RangeColumns`) keeping the changelog rows it
  reduces, and the sequence value taken from the parsed envelopes in bulk. A sequence path of one name
  that is also a row column (the record-by-record way takes the image's value) sends the range back.
- `changelog_history`, the record-by-record way's changelog rows (JSON images, `typed_changes`); also the
  history of a batch decoded by a stateful FROM_CHANGELOG stage (`table_query.HistoryWriter`).

Columns of the part: the typed row columns, then `HISTORY_META` (`Meta`'s source columns; the change's
kind: +U an upsert, -U an update's before image, -D a delete; `SEQUENCE`, the sequence value, null when
the change has none).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.delta.arrow_types import merge_types
from service.config.from_changelog import PATH_SEPARATOR
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder
from service.kafka_to_delta.materialize.payload import HISTORY_META, TypeEvidence, typed_changes
from service.kafka_to_delta.materialize.payload import HISTORY_SEQUENCE as SEQUENCE
from service.kafka_to_delta.rows.names import Column, Meta
from service.kafka_to_delta.source.debezium_columns import RangeColumns
from service.kafka_to_delta.source.envelope_rows import typed_net
from service.kafka_to_delta.source.range_state import _FLAG, _GROUP, _IMAGE, _INFERRED_KINDS, _KEY, _RECORD, _RETRACT
from service.kafka_to_delta.source.vector_plan import NotVectorisable, VectorPlan, vector_plan
from service.kafka_to_delta.source.wrapper_layouts import BARE
from vocabulary.changes import ChangeKind

ROW_KINDS = (ChangeKind.INSERT.value, ChangeKind.UPDATE_AFTER.value, ChangeKind.UPDATE_BEFORE.value,
             ChangeKind.DELETE.value)
_VEC_SEQUENCE = "__vec_sequence"
_SEQUENCE_TYPES = (pa.int64(), pa.float64(), pa.bool_(), pa.string(), pa.null())


def sequence_path(sequence_by: tuple[str, ...]) -> tuple[str, ...]:
    """The path of the history's sequence value (`history_sequence_by`: one value)."""
    if len(sequence_by) != 1:
        raise ValueError(f"a history's sequence_by names one value, not {list(sequence_by)}")
    return tuple(sequence_by[0].split(PATH_SEPARATOR))


def history_plan(decoder: ChangelogBatchDecoder, primary_key: tuple[str, ...]) -> VectorPlan | None:
    """The vectorised decode's plan for a history pipeline's decoder, whose settings carry the history's
    `sequence_by` (the record-by-record way's sequence value; `HistoryColumns` takes it in bulk)."""
    settings = decoder.settings.model_copy(update={"sequence_by": ()})
    view = cast(ChangelogBatchDecoder, _DecoderView(settings, decoder.decode_value, decoder.stage))
    return vector_plan(view, primary_key)


@dataclass(frozen=True)
class _DecoderView:
    """What `vector_plan` reads of a decoder."""

    settings: object
    decode_value: object
    stage: object


def changelog_history(changelog: pa.Table, primary_key: tuple[str, ...]) -> tuple[pa.Table, TypeEvidence]:
    """The history part of changelog rows (`CHANGELOG_SCHEMA` columns with `sequence`): their row
    changes (no failed rows, no markers) typed, with `HISTORY_META`, and their type evidence."""
    rows = changelog.filter(pc.and_(pc.is_null(changelog.column(Column.ERROR)),
                                    pc.is_in(changelog.column(Column.KIND), pa.array(ROW_KINDS))))
    if rows.num_rows == 0:
        return empty_history(), TypeEvidence()
    typed, evidence = typed_changes(rows, primary_key)
    kinds = rows.column(Column.KIND)  # an insert is an upsert as the vectorised way tells them
    kinds = pc.if_else(pc.equal(kinds, ChangeKind.INSERT.value), ChangeKind.UPDATE_AFTER.value, kinds)
    typed = typed.set_column(typed.schema.get_field_index(Meta.KIND), Meta.KIND, kinds)
    texts = rows.column(Column.SEQUENCE).to_pylist()
    sequence = pa.array([None if text is None else json.loads(text)[0] for text in texts])
    typed = typed.drop_columns([Meta.TIMESTAMP]).append_column(SEQUENCE, sequence)
    return typed.select([*typed.column_names[:-len(HISTORY_META)], *HISTORY_META]), evidence


def empty_history() -> pa.Table:
    return pa.schema([(Meta.KEY, pa.string()), (Meta.KIND, pa.string()), (Meta.TOPIC, pa.string()),
                      (Meta.PARTITION, pa.int32()), (Meta.OFFSET, pa.int64()), (Meta.CHANGE_INDEX, pa.int32()),
                      (Meta.UNCHANGED, pa.string()), (SEQUENCE, pa.null())]).empty_table()


@dataclass
class HistoryColumns(RangeColumns):
    """`RangeColumns` that also keeps every changelog row it reduces, with its sequence value."""

    sequence: tuple[str, ...] = ()
    """The sequence value's path (`sequence_path`)."""
    kept: list[pa.Table] = field(default_factory=list)
    reads_envelope: ClassVar[bool] = True  # the sequence value

    def _changelog(self, parsed: pa.Table, group: int, typed: pa.Table | None = None) -> tuple[pa.Table, np.ndarray]:
        rows, keep = super()._changelog(parsed, group, typed)
        if rows.num_rows == 0:
            return rows.append_column(_VEC_SEQUENCE, pa.nulls(0)), keep
        values = self._sequence_values(parsed)
        return rows.append_column(_VEC_SEQUENCE, values.take(rows.column(_RECORD))), keep

    def _conformed(self, rows: pa.Table) -> pa.Table:
        values = rows.column(_VEC_SEQUENCE)
        return super()._conformed(rows.drop_columns([_VEC_SEQUENCE])).append_column(_VEC_SEQUENCE, values)

    def _track_placeholders(self, rows: pa.Table) -> None:
        self.kept.append(rows)  # the chunk's changelog rows, before the reduction that follows
        super()._track_placeholders(rows)

    def _sequence_values(self, parsed: pa.Table) -> pa.Array:
        """Per parsed envelope, its sequence value (null where it has none)."""
        first = self.sequence[0]
        if len(self.sequence) == 1:
            for side in (self.plan.before, self.plan.after):
                if side in parsed.column_names and parsed.schema.field(side).type.get_field_index(first) >= 0:
                    raise NotVectorisable(f"history sequence_by {first!r} is a row column")
        if first not in parsed.column_names:
            raise NotVectorisable(f"history sequence_by: no {first!r} field in the envelopes")
        column = parsed.column(first).combine_chunks()
        for name in self.sequence[1:]:
            if not pa.types.is_struct(column.type) or column.type.get_field_index(name) < 0:
                return pa.nulls(len(column))
            column = pc.struct_field(column, name)
        if column.type not in _SEQUENCE_TYPES:
            raise NotVectorisable(f"history sequence_by is {column.type}")
        return column

    def history(self, primary_key: tuple[str, ...]) -> tuple[pa.Table, TypeEvidence]:
        """The history part of the range's records decoded in Arrow, and its type evidence."""
        if not self.kept:
            return empty_history(), TypeEvidence()
        try:
            rows = pa.concat_tables(self.kept, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            raise NotVectorisable("batches of the range typed a column differently") from None
        if rows.num_rows == 0:
            return empty_history(), TypeEvidence()
        evidence = self._evidence(rows, primary_key)
        typed = typed_net(rows, evidence.types(), primary_key)
        retract, image = _flag(rows.column(_RETRACT)), _flag(rows.column(_IMAGE))
        kinds = np.where(retract, np.where(image, ChangeKind.UPDATE_BEFORE.value, ChangeKind.DELETE.value),
                         ChangeKind.UPDATE_AFTER.value)
        meta = {Meta.KEY: rows.column(_KEY), Meta.KIND: pa.array(kinds, pa.string()),
                Meta.TOPIC: rows.column("__vec_topic"), Meta.PARTITION: rows.column("__vec_partition"),
                Meta.OFFSET: rows.column("__vec_offset"), Meta.CHANGE_INDEX: rows.column("__vec_change_index"),
                Meta.UNCHANGED: _unchanged(rows, ~retract), SEQUENCE: rows.column(_VEC_SEQUENCE)}
        for name in HISTORY_META:
            typed = typed.append_column(name, meta[name])
        return typed, evidence

    def _evidence(self, rows: pa.Table, primary_key: tuple[str, ...]) -> TypeEvidence:
        """The types `typed_changes` would give these rows: declared by their schema versions, the data's
        kinds for the schema-less ones (their upserts; their deletes' keys when there are none)."""
        evidence = TypeEvidence()
        for group in pc.unique(rows.column(_GROUP)).to_pylist():
            if group != BARE:
                evidence.declared = merge_types(evidence.declared, self._layout(group).types)
        upserts = ~_flag(rows.column(_RETRACT))
        bare = _flag(pc.equal(rows.column(_GROUP), BARE))
        inferring = bare & upserts if upserts.any() else bare
        if not inferring.any():
            return evidence
        columns = [n for n in self.order if n in rows.column_names] if upserts.any() else list(primary_key)
        chosen = pa.array(inferring)
        for name in columns:
            flag = _FLAG + name
            if flag in rows.column_names and _flag(rows.column(flag).filter(chosen)).all():
                continue
            values = rows.column(name).filter(chosen)
            if values.null_count == len(values):
                evidence.seen[name] = set()
            elif values.type in _INFERRED_KINDS:
                evidence.seen[name] = {_INFERRED_KINDS[values.type]}
            else:
                raise NotVectorisable(f"column {name!r} of schema-less records is {values.type}")
        return evidence


def _flag(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(pc.fill_null(array, False).to_numpy(zero_copy_only=False), np.bool_)


def _unchanged(rows: pa.Table, upserts: np.ndarray) -> pa.Array:
    """Per upsert, the JSON list of the columns its source left unchanged (a placeholder), else null."""
    flags = [(name[len(_FLAG):], _flag(rows.column(name)) & upserts)
             for name in rows.column_names if name.startswith(_FLAG)]
    texts = np.full(rows.num_rows, None, object)
    if flags:
        for row in np.flatnonzero(np.logical_or.reduce([kept for _, kept in flags])):
            texts[row] = json.dumps([name for name, kept in flags if kept[row]], separators=(",", ":"))
    return pa.array(texts, pa.string())
