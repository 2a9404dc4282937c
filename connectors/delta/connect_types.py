"""Kafka Connect schemas (the JSON converter's `schema` block) -> column type names.

Debezium's logical types (dates, timestamps, decimals, JSON, UUID, ...) map to the Delta
column types they stand for; nested values are kept as JSON text.
"""

from __future__ import annotations

from typing import Any

from connectors.delta.arrow_types import DEFAULT_DECIMAL_PRECISION, TypeName, decimal_type_name

DECIMAL_SCALE_PARAM = "scale"
DECIMAL_PRECISION_PARAM = "connect.decimal.precision"

# Kafka Connect schema keys.
CONNECT_TYPE = "type"
CONNECT_NAME = "name"
CONNECT_FIELD = "field"
CONNECT_FIELDS = "fields"
CONNECT_PARAMETERS = "parameters"
CONNECT_STRUCT = "struct"
ROW_IMAGE_FIELDS = ("after", "before")

CONNECT_PRIMITIVES: dict[str, str] = {
    "int8": TypeName.INT8,
    "int16": TypeName.INT16,
    "int32": TypeName.INT32,
    "int64": TypeName.INT64,
    "float32": TypeName.FLOAT32,
    "float64": TypeName.FLOAT64,
    "float": TypeName.FLOAT64,
    "double": TypeName.FLOAT64,
    "boolean": TypeName.BOOL,
    "string": TypeName.STRING,
    "bytes": TypeName.BINARY,
    # Nested values are kept as JSON text.
    "struct": TypeName.STRING,
    "array": TypeName.STRING,
    "map": TypeName.STRING,
}

CONNECT_DECIMAL = "org.apache.kafka.connect.data.Decimal"
CONNECT_LOGICAL: dict[str, str] = {
    "io.debezium.time.Date": TypeName.DATE32,
    "org.apache.kafka.connect.data.Date": TypeName.DATE32,
    "io.debezium.time.MicroTimestamp": TypeName.TIMESTAMP_US,
    "io.debezium.time.Timestamp": TypeName.TIMESTAMP_MS,
    "org.apache.kafka.connect.data.Timestamp": TypeName.TIMESTAMP_MS,
    "io.debezium.time.NanoTimestamp": TypeName.TIMESTAMP_NS,
    "io.debezium.time.ZonedTimestamp": TypeName.TIMESTAMP_US_UTC,
    "io.debezium.time.Time": TypeName.INT64,
    "io.debezium.time.MicroTime": TypeName.INT64,
    "io.debezium.time.NanoTime": TypeName.INT64,
    "org.apache.kafka.connect.data.Time": TypeName.INT64,
    "io.debezium.data.VariableScaleDecimal": TypeName.STRING,
    "io.debezium.data.Json": TypeName.STRING,
    "io.debezium.data.Uuid": TypeName.STRING,
    "io.debezium.data.Enum": TypeName.STRING,
    "io.debezium.data.EnumSet": TypeName.STRING,
    "io.debezium.data.Xml": TypeName.STRING,
    "io.debezium.time.ZonedTime": TypeName.STRING,
}


def connect_schema_to_types(schema: dict) -> dict[str, str]:
    """Column types from the Kafka Connect schema of a whole Debezium envelope.

    Reads the `after` struct field (or `before` when `after` is absent). Raises `ValueError`
    when the schema is not an envelope schema or a field cannot be mapped.
    """
    return fields_to_types(row_image_schema(schema).get(CONNECT_FIELDS))


def fields_to_types(fields: Any) -> dict[str, str]:
    """Column types from the `fields` list of a row image struct schema."""
    if not isinstance(fields, list):
        raise ValueError("row image schema has no 'fields' list")
    types: dict[str, str] = {}
    for field in fields:
        if not isinstance(field, dict) or not isinstance(field.get(CONNECT_FIELD), str):
            raise ValueError("row image schema has a field without a name")
        types[field[CONNECT_FIELD]] = _field_type(field)
    return types


def row_image_schema(schema: Any) -> dict:
    """The `after` (else `before`) struct schema of a Debezium envelope schema."""
    if not isinstance(schema, dict) or schema.get(CONNECT_TYPE) != CONNECT_STRUCT:
        raise ValueError("envelope schema is not a struct")
    fields = schema.get(CONNECT_FIELDS)
    if not isinstance(fields, list):
        raise ValueError("envelope schema has no 'fields' list")
    by_name = {f.get(CONNECT_FIELD): f for f in fields if isinstance(f, dict)}
    for name in ROW_IMAGE_FIELDS:
        image = by_name.get(name)
        if isinstance(image, dict) and image.get(CONNECT_TYPE) == CONNECT_STRUCT:
            return image
    raise ValueError("envelope schema has no 'after' or 'before' struct field")


def _field_type(field: dict) -> str:
    name = field.get(CONNECT_NAME)
    if name == CONNECT_DECIMAL:
        return _decimal_field_type(field)
    if isinstance(name, str) and name in CONNECT_LOGICAL:
        return CONNECT_LOGICAL[name]
    base = field.get(CONNECT_TYPE)
    if isinstance(base, str) and base in CONNECT_PRIMITIVES:
        return CONNECT_PRIMITIVES[base]
    raise ValueError(f"field {field[CONNECT_FIELD]!r} has an unsupported Connect type")


def _decimal_field_type(field: dict) -> str:
    params = field.get(CONNECT_PARAMETERS)
    params = params if isinstance(params, dict) else {}
    try:
        scale = int(params.get(DECIMAL_SCALE_PARAM, 0))
        precision = int(params.get(DECIMAL_PRECISION_PARAM, DEFAULT_DECIMAL_PRECISION))
    except (TypeError, ValueError):
        raise ValueError(
            f"field {field[CONNECT_FIELD]!r} has invalid decimal parameters"
        ) from None
    return decimal_type_name(precision, scale)
