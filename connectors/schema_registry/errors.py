"""Errors of the Schema Registry adapter: wire format, registry lookups, Avro bodies and schemas.

Decode errors (a record that cannot be read) subclass `vocabulary.errors.DecodeError`, so a caller
locates them with `.at(where)` and keeps the subclass. A registry that cannot be reached, or
answers with a server error, is transient: the same lookup may succeed later. No message
quotes record contents, only lengths, ids, found magic bytes and URLs (without credentials).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from vocabulary.errors import DecodeError, SourceCoordinates, TerminalError, TransientError


def redacted_url(url: str) -> str:
    """`url` without user name and password, for messages and logs."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _restore(cls: type[BaseException], state: dict[str, Any], args: tuple) -> BaseException:
    error = cls.__new__(cls)
    error.__dict__.update(state)
    error.args = args
    return error


class _Picklable:
    """Errors whose constructors take more than a message still pickle (Spark workers)."""

    args: tuple[Any, ...]  # mixed into exceptions only

    def __reduce__(self) -> tuple:
        return _restore, (type(self), dict(self.__dict__), self.args)


class AvroDecodeError(_Picklable, DecodeError):
    """Root of the Avro decode errors; `.at(where)` keeps the subclass and its fields."""

    def at(self, where: SourceCoordinates) -> "AvroDecodeError":
        """The same error, located at `where`."""
        located = type(self).__new__(type(self))
        located.__dict__.update(self.__dict__)
        DecodeError.__init__(located, self.reason, where)
        return located


class ShortFrameError(AvroDecodeError):
    """The value is shorter than the 5-byte Confluent header (magic byte + schema id)."""

    def __init__(self, length: int) -> None:
        self.length = length
        super().__init__(f"Confluent Avro frame is {length} bytes long, shorter than its 5-byte header")


class BadMagicByteError(AvroDecodeError):
    """The first byte is not the Confluent magic byte 0."""

    def __init__(self, found: int) -> None:
        self.found = found
        super().__init__(f"Confluent Avro frame starts with byte 0x{found:02x}, not the magic byte 0x00")


class UnknownSchemaIdError(AvroDecodeError):
    """The frame names a schema id that the registry does not know."""

    def __init__(self, schema_id: int, registry_url: str) -> None:
        self.schema_id, self.registry_url = schema_id, redacted_url(registry_url)
        super().__init__(f"schema id {schema_id} is unknown to the schema registry at {self.registry_url}")


class UnusableSchemaError(AvroDecodeError):
    """The registry holds the schema id, but not as an Avro schema this adapter can read."""

    def __init__(self, schema_id: int, problem: str) -> None:
        self.schema_id, self.problem = schema_id, problem
        super().__init__(f"schema id {schema_id} is not usable: {problem}")


class AvroBodyError(AvroDecodeError):
    """The bytes after the header do not decode with the schema the header names."""

    def __init__(self, schema_id: int, problem: str) -> None:
        self.schema_id, self.problem = schema_id, problem
        super().__init__(f"Avro body does not match schema id {schema_id}: {problem}")


class SchemaRegistryUnavailable(_Picklable, TransientError):
    """The registry did not answer, or answered with a server error: retry later."""

    def __init__(self, registry_url: str, problem: str) -> None:
        self.registry_url, self.problem = redacted_url(registry_url), problem
        super().__init__(f"schema registry at {self.registry_url} is unavailable: {problem}")


class SchemaRegistryRequestError(_Picklable, TerminalError):
    """The registry refused a request (4xx): retrying the same request cannot help."""

    def __init__(self, registry_url: str, request: str, status: int, error_code: int | None, message: str) -> None:
        self.registry_url, self.request = redacted_url(registry_url), request
        self.status, self.error_code, self.message = status, error_code, message
        code = f", error code {error_code}" if error_code is not None else ""
        super().__init__(f"schema registry at {self.registry_url} refused {request}: HTTP {status}{code}: {message}")


class SubjectNotFoundError(SchemaRegistryRequestError):
    """The subject has no registered version (Confluent error code 40401)."""


class AvroEncodeError(_Picklable, TerminalError):
    """A record cannot be written with its Avro schema; names the field, never the value."""


class AvroSchemaError(_Picklable, TerminalError):
    """An Avro schema cannot be built from, or mapped to, the project's column types."""


class IncompatibleSchemaError(SchemaRegistryRequestError):
    """The subject's compatibility rule refused a new schema (HTTP 409); names subject and latest version."""

    def __init__(self, registry_url: str, subject: str, version: int | None, message: str) -> None:
        self.subject, self.version = subject, version
        SchemaRegistryRequestError.__init__(
            self, registry_url, f"a new schema for subject {subject!r} (latest version {version})", 409, 409, message)
