"""The changelog rows of one schema version's parsed envelopes (`EnvelopeRows`, a part of
`debezium_columns.RangeColumns`), and the net rows typed as the record-by-record way types them
(`typed_net`, `meta_columns`).

Each op code emits rows from its images (`vector_plan.VectorPlan`): the key text, the columns as parsed
(nested ones as JSON text) and, per column, a flag where the image holds Debezium's unavailable-value
placeholder (a TOASTed column left unchanged; `debezium_columns` fills it); with `with_texts`, the image's
text, change kind and unchanged columns instead of the columns, and with `with_typed` the typed image
columns besides.

Odd records found here (left to the record-by-record way): an unknown or missing op code (truncates and
messages included); an image missing where the op needs it; a primary key missing, null, a placeholder or
text that JSON escapes; a declared integer out of its type's range. Non-finite doubles of typed (Avro)
columns become null, as the reference's JSON rows make them.

What sends the whole range back (`NotVectorisable`) here: key values other than integers, booleans and
text; a column the two images type differently in a way Arrow cannot unify; a net value that does not
convert to its declared type (`typed_net`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.delta.arrow_types import PLAIN_TEXT, arrow_type
from service.kafka_to_delta.formats.bulk_values import bulk_column, json_text
from service.kafka_to_delta.formats.debezium_json import UNAVAILABLE_VALUE
from service.kafka_to_delta.formats.row_text import row_texts, unchanged_texts
from service.kafka_to_delta.rows.names import TYPED_IMAGE, TYPED_PREFIX
from service.kafka_to_delta.source.range_state import (
    _CHANGE_INDEX,
    _FLAG,
    _GROUP,
    _IMAGE,
    _INFERRED_KINDS,
    _KEY,
    _OFFSET,
    _PARTITION,
    _RECORD,
    _RETRACT,
    _TIMESTAMP,
    _TOPIC,
    _UNCHANGED,
    KIND,
    ROW_TEXT,
    UNCHANGED_TEXT,
    RangeState,
    _mask,
    _shown,
)
from service.kafka_to_delta.source.vector_plan import NotVectorisable
from service.kafka_to_delta.source.wrapper_layouts import BARE
from vocabulary.changes import ChangeKind

_KEY_TYPES = (pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.bool_(), pa.string())


class EnvelopeRows(RangeState):
    """The changelog rows of parsed envelopes: per op code the rows of its images, their key text and flags."""

    def _changelog(self, parsed: pa.Table, group: int, typed: pa.Table | None = None) -> tuple[pa.Table, np.ndarray]:
        """(changelog rows of the parsed records in source order (record, change index), with
        `__record` the parsed row; the parsed rows kept: the others are left to the
        record-by-record way). `typed`: the same records' typed columns (`with_typed`)."""
        op = parsed.column(self.plan.op)
        keep = _mask(pc.is_in(op, pa.array(list(self.plan.codes), pa.string())))
        sides = []
        for position, side_name in enumerate((self.plan.before, self.plan.after)):
            image = parsed.column(side_name).combine_chunks()
            valid = _mask(image.is_valid())
            emits = np.zeros(len(op), np.bool_)
            nulls = np.zeros(len(op), np.bool_)
            for code, pair in self.plan.codes.items():
                side = pair[position]
                if side is None:
                    continue
                coded = _mask(pc.equal(op, code))
                if not side.optional:
                    keep &= ~coded | valid
                emits |= coded & valid
                if side.nulls_unchanged:
                    nulls |= coded & valid
            typed_image = typed.column(side_name).combine_chunks() if typed is not None else None
            rows, misfits = self._side_rows(image, group, nulls & keep, typed_image)
            keep &= ~(emits & (self._unkeyed(image) | misfits))
            sides.append((rows, emits))
        tables = []
        emitted_before = None
        for position, (rows, emits) in enumerate(sides):
            emits = emits & keep
            if position == 0:
                emitted_before = emits
            index = np.flatnonzero(emits)
            if not len(index):
                continue
            codes = op.take(pa.array(index))
            retract, is_image = self._flags(codes, position)
            change_index = (pa.array(emitted_before[index].astype(np.int32)) if position == 1 and emitted_before
                            is not None else pa.array(np.zeros(len(index), np.int32)))
            taken = (rows.take(pa.array(index)).append_column(_RETRACT, retract).append_column(_IMAGE, is_image)
                     .append_column(_GROUP, pa.array(np.full(len(index), group, np.int32)))
                     .append_column(_CHANGE_INDEX, change_index)
                     .append_column(_RECORD, pa.array(index)))
            if self.with_texts:
                taken = taken.append_column(KIND, self._kinds(codes, position))
            tables.append(taken)
        if not tables:
            return self._empty(), keep
        try:
            return pa.concat_tables(tables, promote_options="default"), keep
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise NotVectorisable(f"the two images typed a column differently ({_shown(exc)})") from None

    def _side_rows(self, image: pa.StructArray, group: int, nulls: np.ndarray,
                   typed_image: pa.StructArray | None = None) -> tuple[pa.Table, np.ndarray]:
        """(one side's images as rows: the key text, the columns as parsed (nested ones as JSON
        text), a `_FLAG` column per column holding the unavailable-value placeholder (its value
        null) or, in the images at `nulls` (`ignore_null_updates`), a null outside the primary key;
        the images holding a value only the record-by-record way can judge: one their declared
        type does not take (`bulk_values`)). With `with_texts`, the rows are the key text and the texts
        alone: they stand for the values; with `typed_image` (the same images as typed columns), also
        the typed image columns (`_typed_columns`)."""
        layout = self._layout(group) if group != BARE else None
        misfits = np.zeros(len(image), np.bool_)
        arrays, names, flags = [], [], []
        raw: list[tuple[pa.Array, np.ndarray]] = []  # each column as parsed, with the rows leaving it out
        for child, column in zip(image.type, image.flatten()):
            kept = np.zeros(len(image), np.bool_)
            raw.append((column, kept))
            if pa.types.is_string(column.type):
                kept = _mask(pc.equal(column, UNAVAILABLE_VALUE))
                if kept.any():
                    column = pc.if_else(pa.array(kept), pa.scalar(None, pa.string()), column)
            if nulls.any() and child.name not in self.plan.primary_key:
                absent = nulls & ~_mask(column.is_valid())
                if group == BARE and absent.any():
                    raise NotVectorisable("schema-less update images holding nulls under ignore_null_updates "
                                          "(a column left out cannot be told from a null)")
                kept |= absent
            if kept.any():
                flags.append((_FLAG + child.name, kept))
                raw[-1] = (raw[-1][0], kept)
            if self.with_texts and group in self.typed_groups:
                continue  # typed values, written as the text (`row_texts`): nothing to judge
            if layout is not None and child.name in layout.nested:
                column, misfit = json_text(column, fixed_key_order=True)
                misfits |= misfit
            elif group in self.typed_groups and pa.types.is_floating(column.type):
                # the reference's rows travel as JSON text, where NaN and infinities become null
                column = pc.if_else(pc.is_finite(column), column, pa.scalar(None, column.type))
            elif layout is not None and group not in self.typed_groups:  # typed with the net rows
                misfits |= bulk_column(column, layout.types[child.name])[1]
            elif pa.types.is_nested(column.type):
                column, misfit = json_text(column)
                misfits |= misfit
            arrays.append(column)
            names.append(child.name)
        if self.with_texts:
            columns = [f.name for f in image.type]
            texts = row_texts(len(image), columns, [column for column, _ in raw], [kept for _, kept in raw])
            if texts is None:
                raise NotVectorisable("a row column of a type the changelog text does not take")
            omitted = unchanged_texts(len(image), columns, [kept for _, kept in raw])
            table = pa.table({_KEY: self._key_text(image), ROW_TEXT: texts, UNCHANGED_TEXT: omitted})
            if typed_image is not None:
                for name, array in self._typed_columns(typed_image, group, dict(zip(columns, raw))).items():
                    table = table.append_column(name, array)
            return table, misfits
        arrays.append(self._key_text(image))
        names.append(_KEY)
        for name, kept in flags:
            arrays.append(pa.array(kept))
            names.append(name)
        return pa.Table.from_arrays(arrays, names=names), misfits

    def _typed_columns(self, image: pa.StructArray, group: int,
                       raw: dict[str, tuple[pa.Array, np.ndarray]]) -> dict[str, pa.Array]:
        """One side's typed image columns (`TYPED_PREFIX`), as the plain path types them (`_side_rows` without
        texts, then `typed_net` with the group's declared types): a column left unchanged is null, a
        non-finite float null, nested values JSON text; and `TYPED_IMAGE`, false for an image holding a
        value only its text may type. Nothing where a column is not one the texts were written from, or
        its values do not convert to its declared type in bulk (the rows are then typed from their texts)."""
        types = self._layout(group).types
        typed: dict[str, pa.Array] = {}
        holds = np.ones(len(image), np.bool_)
        for child, column in zip(image.type, image.flatten()):
            if child.name not in raw or child.name not in types:
                return {}
            kept = raw[child.name][1]
            if kept.any():
                column = pc.if_else(pa.array(kept), pa.scalar(None, column.type), column)
            if pa.types.is_floating(column.type):
                column = pc.if_else(pc.is_finite(column), column, pa.scalar(None, column.type))
            elif pa.types.is_nested(column.type):
                column, misfit = json_text(column)
                holds &= ~misfit
            try:
                typed[TYPED_PREFIX + child.name] = _typed(column, types[child.name], arrow_type(types[child.name]))
            except NotVectorisable:
                return {}
        typed[TYPED_IMAGE] = pa.array(holds)
        return typed

    def _kinds(self, codes: pa.Array, position: int) -> pa.Array:
        """The change kind of each row emitted from side `position` for its op code."""
        sides = [(code, pair[position]) for code, pair in self.plan.codes.items() if pair[position] is not None]
        kinds = pa.array([side.kind for _, side in sides if side is not None], pa.string())
        return kinds.take(pc.index_in(codes, value_set=pa.array([code for code, _ in sides], pa.string())))

    def _flags(self, codes: pa.Array, position: int) -> tuple[pa.Array, pa.Array]:
        """(retraction?, image?) of each row emitted from side `position` for its op code."""
        sides = [(code, pair[position]) for code, pair in self.plan.codes.items() if pair[position] is not None]
        retracting = [code for code, side in sides if side is not None and side.retract]
        images = [code for code, side in sides if side is not None and side.image]
        return (pc.is_in(codes, pa.array(retracting, pa.string())), pc.is_in(codes, pa.array(images, pa.string())))

    def _unkeyed(self, image: pa.StructArray) -> np.ndarray:
        """Images whose primary key the record-by-record way must judge: missing, null, the
        placeholder, or text that JSON escapes."""
        names = [f.name for f in image.type]
        bad = np.zeros(len(image), np.bool_)
        for column in self.plan.primary_key:
            if column not in names:
                return np.ones(len(image), np.bool_)
            values = pc.struct_field(image, column)
            if values.type not in _KEY_TYPES and not pa.types.is_null(values.type):
                raise NotVectorisable(f"primary key column {column!r} is {values.type}")
            bad |= ~_mask(values.is_valid())
            if values.type == pa.string():
                bad |= ~_mask(pc.match_substring_regex(values, PLAIN_TEXT))
                bad |= _mask(pc.equal(values, UNAVAILABLE_VALUE))
        return bad

    def _key_text(self, image: pa.StructArray) -> pa.Array:
        """The primary-key text of each image (`canonical_key` of the key values as written);
        meaningful where `_unkeyed` is False."""
        names = [f.name for f in image.type]
        if any(column not in names for column in self.plan.primary_key):
            return pa.nulls(len(image), pa.string())
        parts = []
        for column in self.plan.primary_key:
            values = pc.struct_field(image, column)
            if values.type == pa.string():
                parts.append(pc.binary_join_element_wise('"', values, '"', ""))
            elif values.type == pa.bool_():
                parts.append(pc.if_else(values, "true", "false"))
            else:
                parts.append(pc.cast(values, pa.string()))
        return pc.binary_join_element_wise("[", pc.binary_join_element_wise(*parts, ","), "]", "")

    def _empty(self) -> pa.Table:
        fields = [pa.field(n, self.bare_types.get(n, pa.null())) for n in self.order]
        return pa.schema([*fields, (_KEY, pa.string()), (_RETRACT, pa.bool_()), (_IMAGE, pa.bool_()),
                          (_GROUP, pa.int32()), (_CHANGE_INDEX, pa.int32()), (_RECORD, pa.int64())]).empty_table()


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


def _typed(column: pa.ChunkedArray, type_name: str, target: pa.DataType) -> pa.Array | pa.ChunkedArray:
    if column.type == target:
        return column
    if pa.types.is_null(column.type):
        return pa.nulls(len(column), target)
    if column.type in _INFERRED_KINDS or pa.types.is_string(column.type):
        typed, misfits = bulk_column(column, type_name)
        if misfits.any():
            raise NotVectorisable(f"a value cannot be converted to {type_name}")
        return typed
    try:
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
            "unchanged": net.column(_UNCHANGED)}
