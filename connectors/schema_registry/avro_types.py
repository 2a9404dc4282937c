"""Avro schemas <-> the project's column type names (`connectors.delta.arrow_types`).

Reading maps any Avro field type to a type name: Kafka Connect semantic names (`connect.name`,
as Confluent's AvroConverter writes them for Debezium) win over Avro logical types, which win
over the base type; nested types (record, array, map, multi-type unions) are JSON text. The
schemas built here map back to exactly the type names they were built from:

  int8/int16  int + connect.type        date32            int date
  int32/int64 int/long                  timestamp_ms/us/ns long local-timestamp-millis/micros/nanos
  float32/64  float/double              timestamp_us_utc  long timestamp-micros
  bool, string, binary  boolean, string, bytes            decimal(p,s)  bytes decimal(p,s)

Functions taking `named` expect a schema parsed by `fastavro.parse_schema` (full names) and
the `named_schemas` dict that parse filled, to resolve references.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from connectors.delta.arrow_types import (
    DECIMAL_PATTERN,
    DEFAULT_DECIMAL_PRECISION,
    TypeName,
    decimal_type_name,
)
from connectors.delta.connect_types import (
    CONNECT_DECIMAL,
    CONNECT_LOGICAL,
    DECIMAL_PRECISION_PARAM,
    DECIMAL_SCALE_PARAM,
    ROW_IMAGE_FIELDS,
)
from connectors.schema_registry.errors import AvroSchemaError
from vocabulary.changes import Envelope

TimeUnit = Literal["ms", "us", "ns"]

AVRO_NULL = "null"
AVRO_RECORD = "record"
CONTAINER_TYPES = frozenset({"record", "array", "map"})
BINARY_TYPES = frozenset({"bytes", "fixed"})
CONNECT_NAME = "connect.name"
CONNECT_TYPE = "connect.type"
CONNECT_PARAMETERS = "connect.parameters"
LOGICAL_TYPE = "logicalType"
DECIMAL_LOGICAL = "decimal"
VALUE_RECORD, SOURCE_RECORD, ENVELOPE_RECORD = "Value", "Source", "Envelope"
AVRO_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NOT_NAME_CHARS = re.compile(r"[^A-Za-z0-9_]")

PRIMITIVES: dict[str, str] = {
    "int": TypeName.INT32,
    "long": TypeName.INT64,
    "float": TypeName.FLOAT32,
    "double": TypeName.FLOAT64,
    "boolean": TypeName.BOOL,
    "string": TypeName.STRING,
    "bytes": TypeName.BINARY,
    "fixed": TypeName.BINARY,
}
SMALL_INTS = frozenset({TypeName.INT8, TypeName.INT16})

# Logical type -> (type name, unit of the raw value for timestamps).
LOGICAL: dict[str, tuple[str, TimeUnit | None]] = {
    "date": (TypeName.DATE32, None),
    "time-millis": (TypeName.INT64, None),
    "time-micros": (TypeName.INT64, None),
    "timestamp-millis": (TypeName.TIMESTAMP_US_UTC, "ms"),
    "timestamp-micros": (TypeName.TIMESTAMP_US_UTC, "us"),
    "timestamp-nanos": (TypeName.TIMESTAMP_US_UTC, "ns"),
    "local-timestamp-millis": (TypeName.TIMESTAMP_MS, "ms"),
    "local-timestamp-micros": (TypeName.TIMESTAMP_US, "us"),
    "local-timestamp-nanos": (TypeName.TIMESTAMP_NS, "ns"),
    "uuid": (TypeName.STRING, None),
}

AVRO_FOR_TYPE: dict[str, Any] = {
    TypeName.INT8: {"type": "int", CONNECT_TYPE: TypeName.INT8},
    TypeName.INT16: {"type": "int", CONNECT_TYPE: TypeName.INT16},
    TypeName.INT32: "int",
    TypeName.INT64: "long",
    TypeName.FLOAT32: "float",
    TypeName.FLOAT64: "double",
    TypeName.BOOL: "boolean",
    TypeName.STRING: "string",
    TypeName.BINARY: "bytes",
    TypeName.DATE32: {"type": "int", LOGICAL_TYPE: "date"},
    TypeName.TIMESTAMP_MS: {"type": "long", LOGICAL_TYPE: "local-timestamp-millis"},
    TypeName.TIMESTAMP_US: {"type": "long", LOGICAL_TYPE: "local-timestamp-micros"},
    TypeName.TIMESTAMP_NS: {"type": "long", LOGICAL_TYPE: "local-timestamp-nanos"},
    TypeName.TIMESTAMP_US_UTC: {"type": "long", LOGICAL_TYPE: "timestamp-micros"},
}


def resolve(schema: Any, named: dict[str, Any]) -> Any:
    """`schema` with a reference to a named type replaced by that type's definition."""
    return named.get(schema, schema) if isinstance(schema, str) else schema


def non_null(schema: Any, named: dict[str, Any]) -> Any:
    """The one non-null branch of a nullable union (or `schema` itself); `None` when a union
    has several non-null branches."""
    if isinstance(schema, list):
        branches = [branch for branch in schema if branch != AVRO_NULL]
        if len(branches) != 1:
            return None
        schema = branches[0]
    return resolve(schema, named)


def base_type(schema: Any) -> str:
    """The Avro type keyword of a resolved, non-union schema (`"long"`, `"record"`, ...)."""
    return schema if isinstance(schema, str) else schema["type"]


def _connect_decimal(schema: dict) -> str:
    params = schema.get(CONNECT_PARAMETERS) or {}
    try:
        scale = int(params.get(DECIMAL_SCALE_PARAM, schema.get("scale", 0)))
        precision = int(params.get(DECIMAL_PRECISION_PARAM, DEFAULT_DECIMAL_PRECISION))
    except (TypeError, ValueError):
        raise AvroSchemaError("a Connect decimal has invalid parameters") from None
    return decimal_type_name(precision, scale)


def _annotated_type(schema: dict) -> str | None:
    """The type name a `connect.name`, logical type or `connect.type` gives, if any."""
    connect_name = schema.get(CONNECT_NAME)
    if connect_name == CONNECT_DECIMAL:
        return _connect_decimal(schema)
    if connect_name in CONNECT_LOGICAL:
        return CONNECT_LOGICAL[connect_name]
    logical = schema.get(LOGICAL_TYPE)
    if logical == DECIMAL_LOGICAL and schema["type"] in BINARY_TYPES:
        return decimal_type_name(int(schema["precision"]), int(schema.get("scale", 0)))
    if logical in LOGICAL:
        return LOGICAL[logical][0]
    if schema.get(CONNECT_TYPE) in SMALL_INTS and schema["type"] == "int":
        return schema[CONNECT_TYPE]
    return None


def column_type(schema: Any, named: dict[str, Any]) -> str:
    """The project's type name for an Avro field type (nullable unions unwrapped)."""
    base = non_null(schema, named)
    if base is None:
        return TypeName.STRING
    annotated = _annotated_type(base) if isinstance(base, dict) else None
    return annotated or PRIMITIVES.get(base_type(base), TypeName.STRING)


def timestamp_unit(schema: Any) -> TimeUnit | None:
    """Unit of an Avro logical timestamp whose column type comes from the logical type."""
    if not isinstance(schema, dict) or schema.get(CONNECT_NAME) in CONNECT_LOGICAL:
        return None
    return LOGICAL.get(schema.get(LOGICAL_TYPE, ""), (None, None))[1]


def record_types(record: dict, named: dict[str, Any]) -> dict[str, str]:
    """Column types of a record's fields, in field order."""
    return {field["name"]: column_type(field["type"], named) for field in record["fields"]}


def row_image(record: dict, named: dict[str, Any]) -> dict | None:
    """The `after` (else `before`) record of a Debezium envelope record; `None` for a flat record."""
    fields = {field["name"]: field["type"] for field in record["fields"]}
    if Envelope.OP not in fields:
        return None
    for name in ROW_IMAGE_FIELDS:
        image = non_null(fields[name], named) if name in fields else None
        if isinstance(image, dict) and image["type"] == AVRO_RECORD:
            return image
    return None


def avro_name(text: str) -> str:
    """A valid Avro (dotted) name made from `text`, e.g. a topic name."""
    parts = [NOT_NAME_CHARS.sub("_", part) for part in text.split(".")]
    return ".".join(part if AVRO_NAME.match(part) else f"_{part}" for part in parts)


def avro_type(type_name: str) -> Any:
    """The Avro type of a project type name; raises `AvroSchemaError` for an unknown one."""
    if type_name in AVRO_FOR_TYPE:
        return AVRO_FOR_TYPE[type_name]
    match = DECIMAL_PATTERN.match(type_name) if isinstance(type_name, str) else None
    if match is None:
        raise AvroSchemaError(f"column type {type_name!r} has no Avro counterpart")
    precision, scale = int(match[1]), int(match[2])
    if not 0 <= scale <= precision or precision < 1:
        raise AvroSchemaError(f"column type {type_name!r}: Avro needs 0 <= scale <= precision, precision >= 1")
    return {"type": "bytes", LOGICAL_TYPE: DECIMAL_LOGICAL, "precision": precision, "scale": scale}


def avro_schema_for(
    record_name: str, columns: dict[str, str], *, namespace: str | None = None, required: tuple[str, ...] = ()
) -> dict:
    """An Avro record for columns given as type names; every column is a nullable union
    `["null", T]` with default null, except the `required` ones."""
    fields = []
    for column, type_name in columns.items():
        if not AVRO_NAME.match(column):
            raise AvroSchemaError(f"column {column!r} is not a valid Avro field name")
        avro = avro_type(type_name)
        nullable = column not in required
        field = {"name": column, "type": [AVRO_NULL, avro] if nullable else avro}
        fields.append({**field, "default": None} if nullable else field)
    record = {"type": AVRO_RECORD, "name": record_name, "fields": fields}
    return {**record, "namespace": namespace} if namespace else record


def debezium_envelope_schema(
    namespace: str, columns: dict[str, str], *, source: dict[str, str] | None = None, required: tuple[str, ...] = ()
) -> dict:
    """A Debezium-style envelope record `<namespace>.Envelope`: before and after (nullable
    `Value` records of `columns`), a `Source` record of `source` columns when given, op, ts_ms."""
    value = avro_schema_for(VALUE_RECORD, columns, namespace=namespace, required=required)
    fields: list[dict] = [
        {"name": Envelope.BEFORE, "type": [AVRO_NULL, value], "default": None},
        {"name": Envelope.AFTER, "type": [AVRO_NULL, f"{namespace}.{VALUE_RECORD}"], "default": None},
    ]
    if source is not None:
        fields.append({"name": Envelope.SOURCE, "type": avro_schema_for(SOURCE_RECORD, source, namespace=namespace)})
    fields.append({"name": Envelope.OP, "type": "string"})
    fields.append({"name": Envelope.TS_MS, "type": [AVRO_NULL, "long"], "default": None})
    return {"type": AVRO_RECORD, "name": ENVELOPE_RECORD, "namespace": namespace, "fields": fields}
