"""The JSON record layouts of `output_formats`, built column by column from a flush's `FeedChanges`.

Every value and key is assembled from JSON fragments of whole feed columns (`json_columns`),
so no Python dict is built per row; the bytes equal what `ToChangelog` + `KafkaRecordEncoder`
write for the same flush (tests/unit/service/delta_to_kafka/formats/test_columnar_export.py compares them over many
settings). The records of one change keep the row path's order: -U before +U, -D before its
tombstone; changes come in `FeedChanges` order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import repeat
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from service.config.exports import ChangeFeedColumn, ExportSettings
from service.delta_to_kafka.changelog.feed_changes import NO_ROW, FeedChanges
from service.delta_to_kafka.formats.json_columns import (
    NULL,
    Text,
    dump,
    join,
    json_fragments,
    json_object,
    key_text,
)
from service.delta_to_kafka.formats.output_formats import (
    CONNECTOR,
    Header,
    KafkaRecord,
    SourceField,
)
from service.runtime.collector import collector_paused
from vocabulary.changes import ChangeKind, Envelope

_US_PER_MS = 1000
FULL, KEY = "full", "key"  # an image as it is, or its primary-key columns only (a partial delete)


@dataclass(frozen=True)
class _Part:
    """One record of each change of a kind: its code and where its images come from."""

    code: str | None  # None: the kind is not mapped (no record)
    before: str | None  # "before" / "after" / None: which image of the change
    after: str | None
    source: str  # the image the passthrough columns come from
    before_shape: str = FULL
    tombstone: bool = False


class _Rows:
    """Per-feed-row JSON texts of one flush: column fragments and image member runs."""

    def __init__(self, feed: pa.Table, settings: ExportSettings, passthrough: tuple[str, ...]) -> None:
        self._columns = [c for c in feed.column_names if c not in ChangeFeedColumn.ALL]
        self._passthrough = passthrough
        self.fragments = {c: json_fragments(feed.column(c)) for c in self._columns}
        self._key_columns = settings.primary_key
        self.key = self._members(list(settings.primary_key))

    @cached_property
    def full(self) -> Text:
        """Every column's member (flat records, full images)."""
        return self._members(self._columns)

    @cached_property
    def payload(self) -> Text:
        """The members of an image field: the columns not passed through at the top level."""
        columns = [c for c in self._columns if c not in self._passthrough]
        return self.full if columns == self._columns else self._members(columns)

    @cached_property
    def braced_key(self) -> Text:
        """`{key members}` per feed row."""
        return self._members(list(self._key_columns), braced=True)

    @cached_property
    def braced_full(self) -> Text:
        """`{every column's member}` per feed row."""
        return self._members(self._columns, braced=True)

    @cached_property
    def braced_payload(self) -> Text:
        """`{image field members}` per feed row."""
        columns = [c for c in self._columns if c not in self._passthrough]
        return self.braced_full if columns == self._columns else self._members(columns, braced=True)

    def _members(self, columns: list[str], braced: bool = False) -> Text:
        return join(self._pieces(columns, braced, None))

    def _pieces(self, columns: list[str], braced: bool, rows: np.ndarray | None) -> list[Text]:
        pieces: list[Text] = ["{"] if braced else []
        taken = None if rows is None else pa.array(rows)
        for column in columns:
            fragment = self.fragments[column] if taken is None else self.fragments[column].take(taken)
            pieces += [("," if len(pieces) > braced else "") + key_text(column), fragment]
        return [*pieces, "}"] if braced else pieces

    def pieces_at(self, rows: np.ndarray, shape: str, braced: bool, payload: bool) -> list[Text] | None:
        """An image's pieces (`json_object` joins them in place) at feed rows that all have one, else None.

        Taking each column's fragments and joining them once into the value copies an image's
        text once; the image braced for every feed row, taken, then joined copied it three times."""
        if rows.size == 0 or (rows == NO_ROW).any():
            return None
        columns = list(self._key_columns) if shape == KEY else (self.payload_columns if payload else self._columns)
        return self._pieces(columns, braced, rows)

    @property
    def payload_columns(self) -> list[str]:
        """The columns of an image field: those not passed through at the top level."""
        return [c for c in self._columns if c not in self._passthrough]


def _take(texts: Text, rows: np.ndarray) -> Text:
    """Texts at feed rows; null where the row is NO_ROW."""
    if isinstance(texts, str):
        return texts
    return texts.take(pa.array(rows, mask=rows == NO_ROW))




class ColumnarRecords:
    """Kafka records of JSON exports from paired changes, one column operation per field.

    The parts of each change kind and their order are the layout's; a subclass writes another
    encoding of the same parts (`columnar_avro_records`).
    """

    VALUE_TYPE = pa.string()

    def __init__(self, settings: ExportSettings) -> None:
        self.settings = settings
        self._codes = settings.op_codes
        self._images = settings.image_fields
        self._meta = tuple(c for c in settings.passthrough if c in ChangeFeedColumn.PASSABLE)
        self._columns = tuple(c for c in settings.passthrough if c not in ChangeFeedColumn.PASSABLE)
        self._table_header = (Header.TABLE, settings.table.encode("utf-8"))
        self._parts = {"insert": self._insert_parts(), "update": self._update_parts(), "delete": self._delete_parts()}

    def _insert_parts(self) -> list[_Part]:
        return [_Part(self._codes.code(ChangeKind.INSERT), None, "after", "after")]

    def _update_parts(self) -> list[_Part]:
        before_code, after_code = self._codes.code(ChangeKind.UPDATE_BEFORE), self._codes.code(ChangeKind.UPDATE_AFTER)
        distinct = self._images is not None and self._images[0] != self._images[1]
        if self._codes.combines_updates or (before_code is None and distinct):
            return [_Part(after_code, "before", "after", "after")]
        parts = []
        if before_code is not None and self._images is not None:
            parts.append(_Part(before_code, "before", None, "before"))
        return parts + [_Part(after_code, None, "after", "after")]

    def _delete_parts(self) -> list[_Part]:
        shape = FULL if self.settings.produces_full_deletes else KEY
        parts = [_Part(self._codes.code(ChangeKind.DELETE), "before", None, "last_before", shape)]
        return parts + ([_Part(None, None, None, "last_before", tombstone=True)] if self.settings.tombstones else [])

    def encode(self, feed: pa.Table, changes: FeedChanges, processed_at_ms: int) -> list[KafkaRecord]:
        """The flush's records in order; TypeError when a value has no JSON form (the row path names it)."""
        if len(changes) == 0:
            return []
        rows = self._rows_of(feed)
        kinds = {"insert": changes.before == NO_ROW, "delete": changes.after == NO_ROW}
        kinds["update"] = ~(kinds["insert"] | kinds["delete"])
        ordinals, slots, values, lasts = [], [], [], []
        for kind, parts in self._parts.items():
            picked = np.flatnonzero(kinds[kind])
            if picked.size == 0:
                continue
            images = {"before": changes.before[picked], "after": changes.after[picked],
                      "last_before": changes.last_before[picked]}
            last = changes.last[picked]
            for slot, part in enumerate(parts):
                if part.code is None and not part.tombstone:
                    continue
                value = None if part.tombstone else self._value(feed, rows, part, images, last, processed_at_ms)
                ordinals.append(picked)
                slots.append(np.full(picked.size, slot))
                values += _payloads(value, picked.size)
                lasts.append(last)
        if not ordinals:
            return []
        order = np.lexsort((np.concatenate(slots), np.concatenate(ordinals)))
        last = np.concatenate(lasts)[order]
        return self._records(feed, rows, _in_order(values, order), last)

    def _rows_of(self, feed: pa.Table) -> _Rows:
        return _Rows(feed, self.settings, self._columns)

    def _keys(self, feed: pa.Table, rows: _Rows, last: np.ndarray) -> pa.Array:
        return _take(rows.braced_key, last)  # every change has a last row: no nulls

    def _records(self, feed: pa.Table, rows: _Rows, values: list[bytes | None], last: np.ndarray) -> list[KafkaRecord]:
        keys = pc.cast(self._keys(feed, rows, last), pa.binary()).to_pylist()
        versions = feed.column(ChangeFeedColumn.COMMIT_VERSION).take(pa.array(last)).to_pylist()
        # One headers list per commit version, shared by its records (the producer copies what it sends).
        headers = {v: [self._table_header, (Header.COMMIT_VERSION, str(v).encode("ascii"))] for v in set(versions)}
        with collector_paused():  # records built in C: no Python frame per record
            return list(map(tuple.__new__, repeat(KafkaRecord), zip(keys, values, map(headers.__getitem__, versions))))

    def _image(self, rows: _Rows, part: _Part, which: str | None, images: dict[str, np.ndarray],
               payload: bool) -> Text | list[Text]:
        if which is None:
            return NULL
        shape = part.before_shape if which == "before" else FULL
        pieces = rows.pieces_at(images[which], shape, braced=True, payload=payload)
        if pieces is not None:
            return pieces
        braced = rows.braced_key if shape == KEY else (rows.braced_payload if payload else rows.braced_full)
        return _take(braced, images[which])  # null where the change has no such image: "null" in the value

    def _meta_fields(self, feed: pa.Table, last: np.ndarray) -> list[tuple[str | None, Text]]:
        taken = pa.array(last)
        fields: list[tuple[str | None, Text]] = []
        for column in self._meta:
            values = feed.column(column).take(taken)
            if column == ChangeFeedColumn.COMMIT_TIMESTAMP and values.type.tz is None:
                values = values.cast(pa.timestamp(values.type.unit, tz="UTC"))  # delta-rs gives UTC, unzoned
            fields.append((column, json_fragments(values)))
        return fields

    def _value(self, feed: pa.Table, rows: _Rows, part: _Part, images: dict[str, np.ndarray], last: np.ndarray,
               processed_at_ms: int) -> Text:
        op = [(self.settings.op, dump(part.code))]
        meta = self._meta_fields(feed, last)
        if self._images is None:
            which = cast(str, part.after or part.before)  # a part has at least one image
            shape = part.before_shape if which == "before" else FULL
            members = rows.pieces_at(images[which], shape, braced=False, payload=False)
            if members is None:
                members = [_take(rows.key if shape == KEY else rows.full, images[which])]
            return json_object([*op, *meta, (None, members)])
        columns = [(c, _take(rows.fragments[c], images[part.source])) for c in self._columns]
        before_field, after_field = self._images
        if before_field == after_field:
            image_fields = [(after_field, self._image(rows, part, part.after or part.before, images, True))]
        else:
            image_fields = [(before_field, self._image(rows, part, part.before, images, True)),
                            (after_field, self._image(rows, part, part.after, images, True))]
        if not self.settings.debezium_envelope:
            return json_object([*op, *meta, *columns, *image_fields], null=NULL)
        source = self._source_block(feed, last)
        return json_object([*image_fields, (Envelope.SOURCE, source), *op, (Envelope.TS_MS, str(processed_at_ms)),
                            *meta, *columns], null=NULL)

    def _source_block(self, feed: pa.Table, last: np.ndarray) -> Text:
        taken = pa.array(last)
        version = pc.cast(feed.column(ChangeFeedColumn.COMMIT_VERSION).take(taken), pa.string())
        stamps = feed.column(ChangeFeedColumn.COMMIT_TIMESTAMP).take(taken)
        micros = pc.cast(stamps.cast(pa.timestamp("us", tz=stamps.type.tz)), pa.int64()).to_numpy()
        millis = pa.array(np.floor_divide(micros, _US_PER_MS)).cast(pa.string())
        return json_object([
            (SourceField.CONNECTOR, dump(CONNECTOR)), (SourceField.NAME, dump(self.settings.name)),
            (SourceField.TABLE, dump(self.settings.table)), (SourceField.VERSION, version),
            (SourceField.TS_MS, millis),
        ])


def _payloads(value: Text | None, length: int) -> list[bytes | None]:
    """A part's `length` record values as Python bytes (None: tombstones), each copied once."""
    if value is None:
        return [None] * length
    if isinstance(value, str):
        return [value.encode("utf-8")] * length
    return pc.cast(value, pa.binary()).to_pylist()


def _in_order(values: list[bytes | None], order: np.ndarray) -> list[bytes | None]:
    """`values` at the positions `order` gives (the parts' values interleaved into record order).

    Reordered as Python references: the texts themselves are not copied again (an Arrow take of
    the concatenated parts copied every value once more)."""
    held = np.empty(len(values), dtype=object)
    held[:] = values
    return held[order].tolist()
