"""Key and value serializers of an `avro-confluent` export: Avro schemas built from the Delta
table's columns, registered under `<topic>-key` / `<topic>-value` on first use.

Value layouts follow the export's record layout (`output_formats`):
- Debezium envelope (preset `debezium`): before / after records of the image columns, a
  `source` record, op, ts_ms, and the passthrough fields at the top level;
- before/after images (`before` and `after` set, or -U/+U combined): op, passthrough fields,
  and one nullable record per image field (one record when both name the same field);
- flat: op, the columns and the passthrough change-feed columns.
Every column is nullable with default null, so partial deletes (key columns only) fit the
same schema; a reader decodes the columns they leave out as null (Avro has no absent fields).

The schema is derived from the table when the first record is encoded (so an export may be
configured before its table exists) and derived again when a record carries a column the
schema lacks (the table gained a column): the new schema is registered as the subject's next
version. Adding a nullable column with a default keeps the subject backward compatible.
"""

from __future__ import annotations

from typing import Any, Iterable, Literal

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from connectors.delta.arrow_types import ARROW_TYPES, TypeName, decimal_type_name
from connectors.schema_registry import (
    ConfluentAvroEncoder,
    SchemaRegistryClient,
    avro_name,
    avro_schema_for,
    debezium_envelope_schema,
)
from connectors.schema_registry.errors import AvroEncodeError, AvroSchemaError
from service.config.exports import ChangeFeedColumn, ExportSettings
from service.delta_to_kafka.formats.output_formats import EncodeError, SourceField
from vocabulary.errors import ConfigError

Role = Literal["key", "value"]
Columns = dict[str, str]

_NAMES = {arrow: name for name, arrow in reversed(list(ARROW_TYPES.items()))}
SOURCE_TYPES = {
    SourceField.CONNECTOR: TypeName.STRING, SourceField.NAME: TypeName.STRING, SourceField.TABLE: TypeName.STRING,
    SourceField.VERSION: TypeName.INT64, SourceField.TS_MS: TypeName.INT64,
}
FEED_COLUMN_TYPES = {
    ChangeFeedColumn.COMMIT_VERSION: TypeName.INT64, ChangeFeedColumn.COMMIT_TIMESTAMP: TypeName.TIMESTAMP_US_UTC,
}
"""Types of the change-feed columns an export may pass through."""


def type_name(data_type: pa.DataType) -> str:
    """The project's type name of a Delta column's Arrow type (text for anything else)."""
    if pa.types.is_decimal(data_type):
        return decimal_type_name(data_type.precision, data_type.scale)
    if pa.types.is_timestamp(data_type):
        return TypeName.TIMESTAMP_US_UTC if data_type.tz else TypeName.TIMESTAMP_US
    if pa.types.is_large_string(data_type) or pa.types.is_string_view(data_type):
        return TypeName.STRING
    if pa.types.is_large_binary(data_type) or pa.types.is_binary_view(data_type):
        return TypeName.BINARY
    return _NAMES.get(data_type, TypeName.STRING)


def table_columns(uri: str, storage_options: dict[str, str]) -> Columns:
    """Column name -> type name of the Delta table at `uri`."""
    try:
        schema = pa.schema(DeltaTable(uri, storage_options=storage_options or None).schema().to_arrow())
    except TableNotFoundError:
        raise ConfigError(f"an avro-confluent export found no table to derive its schema from: {uri}") from None
    return {field.name: type_name(field.type) for field in schema}


def _passthrough(export: ExportSettings, columns: Columns) -> Columns:
    known = {**columns, **FEED_COLUMN_TYPES}
    return {name: known[name] for name in export.passthrough if name in known}


def key_schema(export: ExportSettings, columns: Columns) -> dict[str, Any]:
    """The Avro record of the Kafka key: the primary-key columns, required."""
    name = avro_name(export.topic)
    key = {column: columns[column] for column in export.primary_key}
    return avro_schema_for(f"{name}_Key", key, namespace=name, required=export.primary_key)


def value_schema(export: ExportSettings, columns: Columns) -> dict[str, Any]:
    """The Avro record of the Kafka value in the export's layout (see the module docstring)."""
    name = avro_name(export.topic)
    passthrough = _passthrough(export, columns)
    images = export.image_fields
    if images is None:
        record = avro_schema_for(f"{name}_Value", {**columns, **passthrough}, namespace=name)
        record["fields"].insert(0, {"name": export.op, "type": "string"})
        return record
    image_columns = {c: t for c, t in columns.items() if c not in passthrough}
    extra = avro_schema_for(f"{name}_Passthrough", passthrough, namespace=name)["fields"]
    if export.debezium_envelope:
        envelope = debezium_envelope_schema(name, image_columns, source=SOURCE_TYPES)
        envelope["fields"].extend(extra)
        return envelope
    image = avro_schema_for("Image", image_columns, namespace=name)
    fields: list[dict[str, Any]] = [{"name": export.op, "type": "string"}, *extra]
    fields.append({"name": images[0], "type": ["null", image], "default": None})
    if images[1] != images[0]:
        fields.append({"name": images[1], "type": ["null", f"{name}.Image"], "default": None})
    return {"type": "record", "name": f"{name}_Value", "namespace": name, "fields": fields}


def _image_keys(document: dict[str, Any], image_fields: tuple[str, ...]) -> set[str]:
    keys: set[str] = set()
    for field in image_fields:
        image = document.get(field)
        if isinstance(image, dict):
            keys.update(image)
    return keys


class TableAvroSerializer:
    """The key or value serializer of one avro-confluent export (a `ValueSerializer`)."""

    def __init__(self, export: ExportSettings, uri: str, storage_options: dict[str, str], role: Role,
                 client: SchemaRegistryClient) -> None:
        self.export, self.uri, self.storage_options, self.role = export, uri, dict(storage_options), role
        self.client = client
        self.subject = f"{export.topic}-{role}"
        self._encoder: ConfluentAvroEncoder | None = None
        self._columns: set[str] = set()
        self._top_level: set[str] = set()
        self._images = tuple(export.image_fields or ())

    def _derive(self) -> None:
        columns = table_columns(self.uri, self.storage_options)
        builder = key_schema if self.role == "key" else value_schema
        try:
            schema = builder(self.export, columns)
            encoder = ConfluentAvroEncoder(self.client, self.subject, schema)
        except AvroSchemaError as error:
            raise ConfigError(f"export {self.export.name!r}: no Avro schema for table {self.uri}: {error}") from None
        self._encoder = encoder
        self._columns = set(columns)
        self._top_level = {field["name"] for field in schema["fields"]}

    def _fits(self, document: dict[str, Any]) -> bool:
        if self._encoder is None:
            return False
        if not document.keys() <= self._top_level:
            return False
        return not self._images or _image_keys(document, self._images) <= self._columns

    def registered(self, columns: Iterable[str]) -> tuple[int, Any] | None:
        """(schema id, schema definition) of the subject's schema for records of these table columns
        (derived and registered as `encode` would); None when the table has no such columns."""
        columns = set(columns)
        if self._encoder is None or not columns <= self._columns:
            self._derive()
        if not columns <= self._columns or self._encoder is None:
            return None
        return self._encoder.schema_id, self._encoder.codec.definition

    def encode(self, document: dict[str, Any] | None) -> bytes | None:
        """The Confluent-framed Avro bytes of `document`; None for a tombstone."""
        if document is None:
            return None
        if not self._fits(document):
            self._derive()
            if not self._fits(document):
                raise EncodeError(f"{self.subject}: the record has fields that are not columns of table {self.uri}")
        try:
            return self._encoder.encode(document)
        except AvroEncodeError as error:
            raise EncodeError(f"{self.subject}: {error}") from None


def avro_serializers(
    export: ExportSettings, uri: str, storage_options: dict[str, str]
) -> tuple[TableAvroSerializer, TableAvroSerializer]:
    """(key serializer, value serializer) of an avro-confluent export."""
    client = SchemaRegistryClient(connection=export.schema_registry.connection())
    return (
        TableAvroSerializer(export, uri, storage_options, "key", client),
        TableAvroSerializer(export, uri, storage_options, "value", client),
    )
