"""The `avro-confluent` record layouts, built column by column from a flush's `FeedChanges`.

The same parts per change kind and the same order as `columnar_records` (JSON); each part's
value is a document of typed Arrow columns in the layout of `output_formats.value_document`
(images as nested records present where the change has that image), encoded to Avro bodies by
`avro_fragments` under the schema the export's `TableAvroSerializer` registered, then framed.
The bytes equal what `ToChangelog` + `KafkaRecordEncoder` with the same serializers write
(tests/unit/service/delta_to_kafka/formats/test_columnar_types.py).
"""

from __future__ import annotations

from typing import Any, cast

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from service.config.exports import ChangeFeedColumn, ExportSettings
from service.delta_to_kafka.changelog.feed_changes import NO_ROW
from service.delta_to_kafka.formats.avro_fragments import Columns, framed, record_pieces
from service.delta_to_kafka.formats.avro_serializers import TableAvroSerializer
from service.delta_to_kafka.formats.columnar_records import FULL, KEY, ColumnarRecords, _Part
from service.delta_to_kafka.formats.output_formats import CONNECTOR, SourceField
from vocabulary.changes import Envelope

_US_PER_MS = 1000


class _Schema:
    """A registered schema, parsed once: its id, the parsed record and its named types."""

    def __init__(self, schema_id: int, definition: Any) -> None:
        self.schema_id = schema_id
        self.named: dict[str, Any] = {}
        self.parsed = fastavro.parse_schema(definition, self.named)

    def values(self, document: Columns, length: int) -> pa.Array:
        return framed(self.schema_id, record_pieces(self.parsed, document, length, self.named), length)


class _Feed:
    """The flush's feed and the schemas its records are written with."""

    def __init__(self, feed: pa.Table, key: _Schema, value: _Schema) -> None:
        self.table, self.key, self.value = feed, key, value

    def taken(self, columns: list[str], rows: np.ndarray) -> dict[str, pa.Array]:
        """Columns at feed rows; null where the row is NO_ROW."""
        picked = pa.array(rows, mask=rows == NO_ROW)
        return {c: self.table.column(c).take(picked).combine_chunks() for c in columns}


class ColumnarAvroRecords(ColumnarRecords):
    """Kafka records of avro-confluent exports from paired changes, one column operation per field."""

    VALUE_TYPE = pa.binary()

    def __init__(self, settings: ExportSettings, key: TableAvroSerializer, value: TableAvroSerializer) -> None:
        super().__init__(settings)
        self._serializers = (key, value)
        self._schemas: dict[tuple[int, int], tuple[_Schema, _Schema]] = {}

    def _rows_of(self, feed: pa.Table) -> _Feed:  # type: ignore[override]
        columns = [c for c in feed.column_names if c not in ChangeFeedColumn.ALL]
        registered = [serializer.registered(columns) for serializer in self._serializers]
        if None in registered:
            raise TypeError("the table has columns its Avro schema lacks")  # the row path names them
        (key_id, key_definition), (value_id, value_definition) = registered  # type: ignore[misc]
        if (key_id, value_id) not in self._schemas:
            self._schemas[(key_id, value_id)] = (_Schema(key_id, key_definition), _Schema(value_id, value_definition))
        key, value = self._schemas[(key_id, value_id)]
        return _Feed(feed, key, value)

    def _keys(self, feed: pa.Table, rows: _Feed, last: np.ndarray) -> pa.Array:  # type: ignore[override]
        return rows.key.values(Columns(rows.taken(list(self.settings.primary_key), last)), len(last))

    def _columns_of(self, feed: pa.Table) -> list[str]:
        return [c for c in feed.column_names if c not in ChangeFeedColumn.ALL]

    def _image_columns(self, feed: pa.Table, shape: str, payload: bool) -> list[str]:
        if shape == KEY:
            return list(self.settings.primary_key)
        columns = self._columns_of(feed)
        return [c for c in columns if c not in self._columns] if payload else columns

    def _image_record(self, rows: _Feed, part: _Part, which: str | None,
                      images: dict[str, np.ndarray]) -> Columns | None:
        if which is None:
            return None
        shape = part.before_shape if which == "before" else FULL
        at = images[which]
        return Columns(rows.taken(self._image_columns(rows.table, shape, True), at), pa.array(at != NO_ROW))

    def _meta_columns(self, rows: _Feed, last: np.ndarray) -> dict[str, Any]:
        return rows.taken(list(self._meta), last)

    def _value(self, feed: pa.Table, rows: _Feed, part: _Part, images: dict[str, np.ndarray],  # type: ignore[override]
               last: np.ndarray, processed_at_ms: int) -> pa.Array:
        document: dict[str, Any] = {self.settings.op: part.code, **self._meta_columns(rows, last)}
        if self._images is None:
            which = cast(str, part.after or part.before)
            shape = part.before_shape if which == "before" else FULL
            document.update(rows.taken(self._image_columns(feed, shape, False), images[which]))
            return rows.value.values(Columns(document), len(last))
        document.update(rows.taken(list(self._columns), images[part.source]))
        before_field, after_field = self._images
        if before_field == after_field:
            document[after_field] = self._image_record(rows, part, part.after or part.before, images)
        else:
            document[before_field] = self._image_record(rows, part, part.before, images)
            document[after_field] = self._image_record(rows, part, part.after, images)
        if self.settings.debezium_envelope:
            document[Envelope.SOURCE] = self._source(rows, last)
            document[Envelope.TS_MS] = processed_at_ms
        return rows.value.values(Columns(document), len(last))

    def _source(self, rows: _Feed, last: np.ndarray) -> Columns:
        taken = rows.taken([ChangeFeedColumn.COMMIT_VERSION, ChangeFeedColumn.COMMIT_TIMESTAMP], last)
        stamps = taken[ChangeFeedColumn.COMMIT_TIMESTAMP]
        micros = pc.cast(stamps.cast(pa.timestamp("us", tz=stamps.type.tz)), pa.int64()).to_numpy()
        return Columns({
            SourceField.CONNECTOR: CONNECTOR, SourceField.NAME: self.settings.name,
            SourceField.TABLE: self.settings.table, SourceField.VERSION: taken[ChangeFeedColumn.COMMIT_VERSION],
            SourceField.TS_MS: pa.array(np.floor_divide(micros, _US_PER_MS)),
        })
