"""The Confluent wire format: magic byte 0, a 4-byte big-endian schema id, then the Avro body."""

from __future__ import annotations

import struct

from connectors.schema_registry.errors import BadMagicByteError, ShortFrameError

MAGIC_BYTE = 0
HEADER = struct.Struct(">BI")
HEADER_SIZE = HEADER.size
MAX_SCHEMA_ID = 2**32 - 1


def frame(schema_id: int, body: bytes) -> bytes:
    """The Confluent frame of an Avro body written with schema `schema_id`."""
    if not 0 <= schema_id <= MAX_SCHEMA_ID:
        raise ValueError(f"schema id {schema_id} does not fit in 4 unsigned bytes")
    return HEADER.pack(MAGIC_BYTE, schema_id) + body


def split_frame(value: bytes) -> tuple[int, memoryview]:
    """(schema id, Avro body) of a framed value, the body without a copy.

    Raises `ShortFrameError` below 5 bytes and `BadMagicByteError` when the first byte is not 0.
    """
    if len(value) < HEADER_SIZE:
        raise ShortFrameError(len(value))
    magic, schema_id = HEADER.unpack_from(value)
    if magic != MAGIC_BYTE:
        raise BadMagicByteError(magic)
    return schema_id, memoryview(value)[HEADER_SIZE:]
