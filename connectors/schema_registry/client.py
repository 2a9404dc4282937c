"""The project's view of a Confluent Schema Registry, over `confluent_kafka.schema_registry`.

- `schema_by_id(id)`: the schema of an id (with its references resolved), parsed once with
  `fastavro.parse_schema` and cached by id for the life of the client.
- `register(subject, schema)`: registers under a subject, cached per (subject, text); a schema
  the subject's compatibility rule refuses raises `IncompatibleSchemaError` naming the subject
  and its latest version.
- `latest(subject)`: the latest version of a subject, never cached.

TLS (custom CA, client certificate), basic or bearer auth, retries with backoff and the HTTP
session are the confluent client's. It is built lazily, on first use, on the process that uses
it: the client pickles as its `RegistryConnection` alone, so each Spark executor builds its own, and
unpickles as the one client of that connection in the process (the tasks of a worker share it).
Unreachable registries, timeouts and 5xx/408/429 answers that outlast the retries raise
`SchemaRegistryUnavailable` (transient); other refusals raise `SchemaRegistryRequestError`.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Any

import fastavro
from confluent_kafka.schema_registry import Schema, SchemaReference
from confluent_kafka.schema_registry import SchemaRegistryClient as ConfluentClient
from confluent_kafka.schema_registry.common._httpx_compat import (
    httpx,  # httpx or httpx2, as installed
)
from confluent_kafka.schema_registry.error import SchemaRegistryError

from connectors.schema_registry.connection import RegistryConnection
from connectors.schema_registry.errors import (
    IncompatibleSchemaError,
    SchemaRegistryRequestError,
    SchemaRegistryUnavailable,
    SubjectNotFoundError,
    UnknownSchemaIdError,
    UnusableSchemaError,
)
from connectors.schema_registry.references import full_name, inline_references

AVRO_SCHEMA_TYPE = "AVRO"
COMPACT_SEPARATORS = (",", ":")
SCHEMA_NOT_FOUND = 40403
SUBJECT_NOT_FOUND = 40401
INCOMPATIBLE = 409
RETRYABLE_STATUS = frozenset({408, 429})
SERVER_ERROR_STATUS = 500
MAX_REFERENCE_DEPTH = 16


@dataclass(frozen=True)
class RegisteredSchema:
    """A schema as the registry holds it: id, text, JSON definition and fastavro's parse."""

    schema_id: int
    text: str
    definition: Any
    parsed: Any
    subject: str | None = None
    version: int | None = None


def schema_text(schema: Any) -> str:
    """Compact JSON text of an Avro schema definition (a text is returned unchanged)."""
    return schema if isinstance(schema, str) else json.dumps(schema, separators=COMPACT_SEPARATORS)


class SchemaRegistryClient:
    """Client of one Schema Registry; `url`/`auth`/`timeout` or a full `connection`."""

    def __init__(self, url: str | None = None, *, auth: tuple[str, str] | None = None,
                 timeout: float | None = None, connection: RegistryConnection | None = None) -> None:
        if connection is None:
            if url is None:
                raise ValueError("SchemaRegistryClient needs a url or a connection")
            connection = RegistryConnection.basic(url, auth, timeout)
        self.connection = connection
        self.url = connection.url
        self._lock = threading.Lock()
        self._client: ConfluentClient | None = None
        self._by_id: dict[int, RegisteredSchema] = {}
        self._registered: dict[tuple[str, str], int] = {}

    def __reduce__(self) -> tuple:
        return _rebuild_client, (self.connection,)

    @property
    def confluent(self) -> ConfluentClient:
        """The confluent client, built on first use in this process."""
        if self._client is None:
            self._client = ConfluentClient(self.connection.client_config())
        return self._client

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        """The schema registered under `schema_id`; raises `UnknownSchemaIdError` if there is none."""
        cached = self._by_id.get(schema_id)
        if cached is not None:
            return cached
        with self._lock:
            cached = self._by_id.get(schema_id)
            if cached is None:
                cached = self._fetch_by_id(schema_id)
                self._by_id[schema_id] = cached
        return cached

    def _fetch_by_id(self, schema_id: int) -> RegisteredSchema:
        what = f"GET /schemas/ids/{schema_id}"
        try:
            schema = self._call(what, lambda: self.confluent.get_schema(schema_id))
        except SchemaRegistryRequestError as exc:
            # A bare 404 (no Confluent error code) means a wrong URL, not an unknown id.
            if exc.error_code == SCHEMA_NOT_FOUND:
                raise UnknownSchemaIdError(schema_id, self.url) from None
            raise
        return self._parsed(schema_id, schema)

    def _parsed(self, schema_id: int, schema: Schema, subject: str | None = None,
                version: int | None = None) -> RegisteredSchema:
        kind = schema.schema_type or AVRO_SCHEMA_TYPE
        if kind != AVRO_SCHEMA_TYPE or not isinstance(schema.schema_str, str):
            raise UnusableSchemaError(schema_id, f"it is a {kind} schema, not Avro")
        referenced: dict[str, Any] = {}
        self._resolve(schema_id, schema.references or [], referenced, 0)
        try:
            definition = inline_references(json.loads(schema.schema_str), referenced)
            parsed = fastavro.parse_schema(definition)
        except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
            raise UnusableSchemaError(schema_id, f"invalid Avro schema ({type(exc).__name__})") from None
        return RegisteredSchema(schema_id, schema.schema_str, definition, parsed, subject, version)

    def _resolve(self, schema_id: int, references: list[SchemaReference], named: dict[str, Any], depth: int) -> None:
        """Referenced definitions (depth first, their own references inlined) into `named` by full name."""
        if depth > MAX_REFERENCE_DEPTH:
            raise UnusableSchemaError(schema_id, f"schema references nest deeper than {MAX_REFERENCE_DEPTH}")
        for reference in references:
            what = f"GET /subjects/{reference.subject}/versions/{reference.version}"
            found = self._call(what, lambda r=reference: self.confluent.get_version(r.subject, r.version))
            inner: dict[str, Any] = {}
            self._resolve(schema_id, found.schema.references or [], inner, depth + 1)
            try:
                definition = inline_references(json.loads(found.schema.schema_str), inner)
                name = full_name(definition)
                if name is None:
                    raise ValueError("not a named type")
                named[name] = definition
            except ValueError as exc:
                raise UnusableSchemaError(schema_id, f"reference {reference.name!r} is not a valid Avro schema "
                                                     f"({type(exc).__name__})") from None

    def register(self, subject: str, schema: Any, references: list[SchemaReference] | None = None) -> int:
        """Register `schema` (definition or text) under `subject`; its id, cached per (subject, text)."""
        text = schema_text(schema)
        cached = self._registered.get((subject, text))
        if cached is not None:
            return cached
        with self._lock:
            cached = self._registered.get((subject, text))
            if cached is None:
                cached = self._register(subject, Schema(text, AVRO_SCHEMA_TYPE, references or []))
                self._registered[(subject, text)] = cached
        return cached

    def _register(self, subject: str, schema: Schema) -> int:
        what = f"POST /subjects/{subject}/versions"
        try:
            return self._call(what, lambda: self.confluent.register_schema(subject, schema))
        except SchemaRegistryRequestError as exc:
            if exc.status != INCOMPATIBLE:
                raise
            latest = self.latest(subject)
            raise IncompatibleSchemaError(self.url, subject, latest.version, exc.message) from None

    def latest(self, subject: str) -> RegisteredSchema:
        """The latest version registered under `subject`; raises `SubjectNotFoundError` if there is none."""
        what = f"GET /subjects/{subject}/versions/latest"
        found = self._call(what, lambda: self.confluent.get_version(subject, "latest"))
        return self._parsed(found.schema_id, found.schema, found.subject, found.version)

    def _call(self, what: str, request: Any) -> Any:
        """Run one confluent client call; its answer, or the adapter's error for a failure."""
        try:
            return request()
        except SchemaRegistryError as exc:
            raise self._refusal(what, exc) from None
        except (httpx.HTTPError, OSError) as exc:
            raise SchemaRegistryUnavailable(self.url, f"{what}: {type(exc).__name__}: {exc}") from None
        except ValueError:
            raise SchemaRegistryUnavailable(self.url, f"{what}: the answer is not JSON") from None

    def _refusal(self, what: str, exc: SchemaRegistryError) -> Exception:
        status, message = exc.http_status_code, str(exc.error_message)
        code = exc.error_code if isinstance(exc.error_code, int) and exc.error_code >= 0 else None
        if status >= SERVER_ERROR_STATUS or status in RETRYABLE_STATUS:
            return SchemaRegistryUnavailable(self.url, f"{what}: HTTP {status}: {message}")
        error = SubjectNotFoundError if code == SUBJECT_NOT_FOUND else SchemaRegistryRequestError
        return error(self.url, what, status, code, message)


_UNPICKLED: dict[RegistryConnection, SchemaRegistryClient] = {}
_UNPICKLED_LOCK = threading.Lock()


def _rebuild_client(connection: RegistryConnection) -> SchemaRegistryClient:
    """An unpickled client: one per connection in a process, so the tasks of a worker share its session and
    the schemas it fetched (an id's schema never changes). Each task unpickles its decoders anew: a client
    each built its HTTPS session (an SSL context, about 20 ms) and fetched every schema id again, 7 % of the
    Python workers' CPU on Avro at batches of 10,000 (docs/design/materializer-state.md)."""
    with _UNPICKLED_LOCK:
        client = _UNPICKLED.get(connection)
        if client is None:
            client = _UNPICKLED[connection] = SchemaRegistryClient(connection=connection)
        return client


def _forget_unpickled() -> None:
    """In a forked child: its parent's clients hold the parent's connections."""
    global _UNPICKLED_LOCK
    _UNPICKLED.clear()
    _UNPICKLED_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_unpickled)
