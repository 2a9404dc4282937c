"""Confluent wire format: header round trip, the distinct frame errors, located errors."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.schema_registry.errors import (
    AvroBodyError,
    BadMagicByteError,
    SchemaRegistryUnavailable,
    ShortFrameError,
    UnknownSchemaIdError,
    redacted_url,
)
from connectors.schema_registry.wire_format import HEADER_SIZE, MAX_SCHEMA_ID, frame, split_frame
from vocabulary.errors import DecodeError, SourceCoordinates, TerminalError, TransientError
from vocabulary.redaction import fingerprint

WHERE = SourceCoordinates("orders", 3, 1234, "k-1")
SECRET = b"s3cr3t-personal-data"


@given(st.integers(0, MAX_SCHEMA_ID), st.binary(max_size=64))
def test_frame_round_trip(schema_id: int, body: bytes) -> None:
    framed = frame(schema_id, body)
    assert framed[0] == 0 and len(framed) == HEADER_SIZE + len(body)
    assert split_frame(framed)[0] == schema_id
    assert bytes(split_frame(framed)[1]) == body


def test_header_is_big_endian() -> None:
    assert frame(0x01020304, b"x") == b"\x00\x01\x02\x03\x04x"
    assert split_frame(b"\x00\x00\x00\x01\x00")[0] == 256


@pytest.mark.parametrize("schema_id", [-1, MAX_SCHEMA_ID + 1])
def test_frame_rejects_ids_outside_four_bytes(schema_id: int) -> None:
    with pytest.raises(ValueError, match="4 unsigned bytes"):
        frame(schema_id, b"")


@pytest.mark.parametrize("value", [b"", b"\x00", b"\x00\x00\x00\x01"])
def test_short_frame(value: bytes) -> None:
    with pytest.raises(ShortFrameError) as caught:
        split_frame(value)
    assert isinstance(caught.value, DecodeError) and isinstance(caught.value, TerminalError)
    assert caught.value.length == len(value)
    assert f"{len(value)} bytes long" in str(caught.value)


def test_a_header_alone_is_a_frame_with_an_empty_body() -> None:
    schema_id, body = split_frame(b"\x00\x00\x00\x00\x07")
    assert (schema_id, bytes(body)) == (7, b"")


@pytest.mark.parametrize("first", [1, 0x7B, 0xFF])
def test_bad_magic_byte_names_the_byte_found(first: int) -> None:
    with pytest.raises(BadMagicByteError) as caught:
        split_frame(bytes([first]) + b"\x00\x00\x00\x01" + SECRET)
    assert caught.value.found == first
    assert f"0x{first:02x}" in str(caught.value)
    assert SECRET.decode() not in str(caught.value)


def test_a_json_value_is_told_apart_from_avro() -> None:
    with pytest.raises(BadMagicByteError, match="0x7b"):
        split_frame(b'{"op":"c","after":{"email":"s3cr3t"}}')


def test_located_errors_keep_their_class_and_fields() -> None:
    located = BadMagicByteError(0x7B).at(WHERE)
    assert isinstance(located, BadMagicByteError) and located.found == 0x7B
    assert located.where == WHERE
    # The key is personal data: its fingerprint by default (log_values: false).
    assert str(located).endswith(f"(topic=orders partition=3 offset=1234 key=<redacted #{fingerprint('k-1')}>)")
    unknown = UnknownSchemaIdError(42, "http://registry:8081").at(WHERE)
    assert isinstance(unknown, UnknownSchemaIdError) and unknown.schema_id == 42
    assert "schema id 42" in str(unknown) and "http://registry:8081" in str(unknown)


@pytest.mark.parametrize(
    "error",
    [
        ShortFrameError(3),
        BadMagicByteError(9).at(WHERE),
        UnknownSchemaIdError(5, "http://r:1"),
        AvroBodyError(5, "the body ends before the record does").at(WHERE),
        SchemaRegistryUnavailable("http://r:1", "connection refused"),
    ],
)
def test_errors_survive_pickling(error: Exception) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error)
    assert copy.__dict__ == error.__dict__


def test_unavailable_registry_is_transient_and_hides_credentials() -> None:
    error = SchemaRegistryUnavailable("https://user:pa55@registry.example:8081/sr", "timed out")
    assert isinstance(error, TransientError)
    assert "pa55" not in str(error) and "user" not in str(error)
    assert "https://registry.example:8081/sr" in str(error)


def test_redacted_url_keeps_urls_without_credentials() -> None:
    assert redacted_url("http://127.0.0.1:8081") == "http://127.0.0.1:8081"
    assert redacted_url("http://u@h") == "http://h"
