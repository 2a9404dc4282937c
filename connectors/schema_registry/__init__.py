"""Confluent Schema Registry: wire format, REST client, Avro <-> JSON-form codec.

Names are imported on first use (PEP 562): a process that reads JSON only never loads the
REST client and its HTTP stack (about 30 MiB).
"""

from importlib import import_module
from typing import Any

_HOMES = {
    "AvroRecordCodec": "avro_codec",
    "ConfluentAvroDecoder": "avro_codec",
    "ConfluentAvroEncoder": "avro_codec",
    "avro_name": "avro_types",
    "avro_schema_for": "avro_types",
    "column_type": "avro_types",
    "debezium_envelope_schema": "avro_types",
    "RegisteredSchema": "client",
    "SchemaRegistryClient": "client",
    "frame": "wire_format",
    "split_frame": "wire_format",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{home}"), name)
