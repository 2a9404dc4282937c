"""Captured Debezium records (JSON with the Connect schema blocks) re-encoded as Confluent Avro.

A SHORTCUT for the Debezium Avro converter: Confluent's `io.confluent.connect.avro.AvroConverter`
is not on Maven Central, so the records a real capture wrote with `JsonConverter`
(`schemas.enable=true`) are converted here the way that converter maps Connect schemas to Avro
(Confluent `AvroData.fromConnectSchema`), then written with fastavro in the Confluent wire format
(magic byte 0, the 4-byte schema id, the Avro body) and the schemas registered under
`<topic>-key` / `<topic>-value` (TopicNameStrategy):

- struct -> record named after the Connect name (namespace = what precedes its last dot);
- int8/int16 -> int with `connect.type`; int32 -> int; int64 -> long; float32/64 -> float/double;
- a named schema keeps `connect.name`, `connect.version`, `connect.parameters`;
- org.apache.kafka.connect.data.Decimal -> bytes, logicalType decimal, precision from
  `connect.decimal.precision`, scale (the JSON value is base64 of the same bytes);
- array -> array of its item schema;
- optional -> union with null, null first and default null; a non-null default puts the type first.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import fastavro
import orjson

from connectors.schema_registry.client import SchemaRegistryClient

DECIMAL = "org.apache.kafka.connect.data.Decimal"
PRECISION = "connect.decimal.precision"
_PRIMITIVE = {"int8": "int", "int16": "int", "int32": "int", "int64": "long", "float32": "float",
              "float64": "double", "boolean": "boolean", "string": "string", "bytes": "bytes"}


def avro_schema(connect: dict, defined: set[str] | None = None) -> Any:
    """The Avro schema AvroConverter derives from one Connect schema (JSON form); a record named
    twice is defined once, then referred to by its full name."""
    defined = set() if defined is None else defined
    kind = connect["type"]
    if kind == "struct":
        name = connect.get("name", "ConnectDefault")
        if name in defined:
            return name
        defined.add(name)
        namespace, _, short = name.rpartition(".")
        schema: Any = {"type": "record", "name": short,
                       "fields": [_field(child, defined) for child in connect["fields"]]}
        if namespace:
            schema["namespace"] = namespace
        if "version" in connect:
            schema["connect.version"] = connect["version"]
        return schema
    if kind == "array":
        schema = {"type": "array", "items": _optional(connect["items"], defined)}
    elif kind == "map":
        schema = {"type": "map", "values": _optional(connect["values"], defined)}
    else:
        schema = {"type": _PRIMITIVE[kind]}
        if kind in ("int8", "int16"):
            schema["connect.type"] = kind
    name = connect.get("name")
    if name:
        schema["connect.name"] = name
        if "version" in connect:
            schema["connect.version"] = connect["version"]
        if connect.get("parameters"):
            schema["connect.parameters"] = connect["parameters"]
        if name == DECIMAL:
            parameters = connect.get("parameters", {})
            schema.update(logicalType="decimal", precision=int(parameters.get(PRECISION, 64)),
                          scale=int(parameters.get("scale", 0)))
    if connect.get("default") is not None:
        schema["connect.default"] = connect["default"]
    return schema if len(schema) > 1 else schema["type"]


def _optional(connect: dict, defined: set[str]) -> Any:
    schema = avro_schema(connect, defined)
    if not connect.get("optional"):
        return schema
    return ["null", schema] if connect.get("default") is None else [schema, "null"]


def _field(connect: dict, defined: set[str]) -> dict:
    field = {"name": connect["field"], "type": _optional(connect, defined)}
    if connect.get("optional"):
        field["default"] = connect.get("default")
    elif connect.get("default") is not None:
        field["default"] = connect["default"]
    return field


def _decimal_paths(connect: dict) -> list[tuple[str, ...]]:
    """Paths of Decimal fields (their JSON values are base64 text, Avro wants the bytes)."""
    paths = []
    for child in connect.get("fields", ()):
        if child.get("name") == DECIMAL:
            paths.append((child["field"],))
        elif child["type"] == "struct":
            paths += [(child["field"], *rest) for rest in _decimal_paths(child)]
    return paths


def _debase64(document: dict, paths: list[tuple[str, ...]]) -> dict:
    for path in paths:
        holder = document
        for step in path[:-1]:
            holder = holder.get(step) if holder else None
        if holder and isinstance(holder.get(path[-1]), str):
            holder[path[-1]] = base64.b64decode(holder[path[-1]])
    return document


class _Side:
    """One side (key or value) of one topic: its schema from the first record, registered once."""

    def __init__(self, client: SchemaRegistryClient, subject: str) -> None:
        self.client, self.subject = client, subject
        self.connect_text: bytes | None = None
        self.parsed = None
        self.header = b""
        self.decimals: list[tuple[str, ...]] = []

    def encode(self, document: dict) -> bytes:
        connect = document["schema"]
        text = orjson.dumps(connect)
        if text != self.connect_text:
            schema = avro_schema(connect)
            self.parsed = fastavro.parse_schema(schema)
            schema_id = self.client.register(self.subject, orjson.dumps(schema).decode())
            self.header = b"\x00" + schema_id.to_bytes(4, "big")
            self.decimals = _decimal_paths(connect)
            self.connect_text = text
        out = io.BytesIO()
        out.write(self.header)
        fastavro.schemaless_writer(out, self.parsed, _debase64(document["payload"], self.decimals))
        return out.getvalue()


class ConnectAvroConverter:
    """Re-encodes the records of one topic (JSON with schema blocks) as Confluent Avro for `topic`."""

    def __init__(self, client: SchemaRegistryClient, topic: str) -> None:
        self.keys = _Side(client, f"{topic}-key")
        self.values = _Side(client, f"{topic}-value")

    def convert(self, key: bytes | None, value: bytes | None) -> tuple[bytes | None, bytes | None]:
        """(key, value) in Avro; a null stays null (a tombstone's value)."""
        return (None if key is None else self.keys.encode(orjson.loads(key)),
                None if value is None else self.values.encode(orjson.loads(value)))
