"""Confluent Schema Registry: wire format, REST client, Avro <-> JSON-form codec."""

from connectors.schema_registry.avro_codec import AvroRecordCodec, ConfluentAvroDecoder, ConfluentAvroEncoder
from connectors.schema_registry.avro_types import avro_name, avro_schema_for, column_type, debezium_envelope_schema
from connectors.schema_registry.client import RegisteredSchema, SchemaRegistryClient
from connectors.schema_registry.wire_format import frame, split_frame

__all__ = [
    "AvroRecordCodec",
    "ConfluentAvroDecoder",
    "ConfluentAvroEncoder",
    "RegisteredSchema",
    "SchemaRegistryClient",
    "avro_name",
    "avro_schema_for",
    "column_type",
    "debezium_envelope_schema",
    "frame",
    "split_frame",
]
