"""A Confluent Schema Registry client for the REST subset the Avro codec needs (stdlib HTTP).

- `schema_by_id(id)`: GET /schemas/ids/{id}, cached by id for the life of the client (a
  registered id never changes its schema), parsed once with `fastavro.parse_schema`.
- `register(subject, schema)`: POST /subjects/{subject}/versions, cached per (subject, text).
- `latest(subject)`: GET /subjects/{subject}/versions/latest, never cached.

Lookups are thread-safe. Unreachable registries, timeouts and 5xx/408/429 answers raise
`SchemaRegistryUnavailable` (transient, no retry here: the caller owns the retry policy);
other refusals raise `SchemaRegistryRequestError`. Only Avro schemas without references are
supported. The client pickles as its settings alone, so Spark workers rebuild their caches.
"""

from __future__ import annotations

import base64
import http.client
import json
import threading
from dataclasses import dataclass
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import quote
from urllib.request import Request, urlopen

import fastavro

from connectors.schema_registry.errors import (
    SchemaRegistryRequestError,
    SchemaRegistryUnavailable,
    SubjectNotFoundError,
    UnknownSchemaIdError,
    UnusableSchemaError,
)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
ACCEPT = f"{CONTENT_TYPE}, application/json"
DEFAULT_TIMEOUT_S = 10.0
AVRO_SCHEMA_TYPE = "AVRO"
COMPACT_SEPARATORS = (",", ":")
SCHEMA_NOT_FOUND = 40403
SUBJECT_NOT_FOUND = 40401
RETRYABLE_STATUS = frozenset({408, 429})
SERVER_ERROR_STATUS = 500


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


def _parsed(schema_id: int, answer: Any) -> tuple[str, Any, Any]:
    """(text, definition, parsed) of a /schemas/ids answer; raises `UnusableSchemaError`."""
    if not isinstance(answer, dict) or not isinstance(answer.get("schema"), str):
        raise UnusableSchemaError(schema_id, "the registry answer has no schema text")
    kind = answer.get("schemaType", AVRO_SCHEMA_TYPE)
    if kind != AVRO_SCHEMA_TYPE:
        raise UnusableSchemaError(schema_id, f"it is a {kind} schema, not Avro")
    if answer.get("references"):
        raise UnusableSchemaError(schema_id, "schema references are not supported")
    text = answer["schema"]
    try:
        definition = json.loads(text)
        return text, definition, fastavro.parse_schema(definition)
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        raise UnusableSchemaError(schema_id, f"invalid Avro schema ({type(exc).__name__})") from None


class SchemaRegistryClient:
    """Client of one Schema Registry at `url`; `auth` is (user, password) for HTTP basic auth."""

    def __init__(self, url: str, *, auth: tuple[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.auth = auth
        self.timeout = timeout
        self._lock = threading.Lock()
        self._by_id: dict[int, RegisteredSchema] = {}
        self._registered: dict[tuple[str, str], int] = {}

    def __reduce__(self) -> tuple:
        return _rebuild_client, (self.url, self.auth, self.timeout)

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
        try:
            answer = self._call("GET", f"/schemas/ids/{schema_id}")
        except SchemaRegistryRequestError as exc:
            # A bare 404 (no Confluent error code) means a wrong URL, not an unknown id.
            if exc.error_code == SCHEMA_NOT_FOUND:
                raise UnknownSchemaIdError(schema_id, self.url) from None
            raise
        text, definition, parsed = _parsed(schema_id, answer)
        return RegisteredSchema(schema_id, text, definition, parsed)

    def register(self, subject: str, schema: Any) -> int:
        """Register `schema` (definition or text) under `subject`; its id, cached per (subject, text)."""
        text = schema_text(schema)
        cached = self._registered.get((subject, text))
        if cached is not None:
            return cached
        with self._lock:
            cached = self._registered.get((subject, text))
            if cached is None:
                body = {"schema": text, "schemaType": AVRO_SCHEMA_TYPE}
                path = f"/subjects/{quote(subject, safe='')}/versions"
                cached = self._answer_id(self._call("POST", path, body), f"POST {path}")
                self._registered[(subject, text)] = cached
        return cached

    def latest(self, subject: str) -> RegisteredSchema:
        """The latest version registered under `subject`; raises `SubjectNotFoundError` if there is none."""
        path = f"/subjects/{quote(subject, safe='')}/versions/latest"
        answer = self._call("GET", path)
        schema_id = self._answer_id(answer, f"GET {path}")
        text, definition, parsed = _parsed(schema_id, answer)
        return RegisteredSchema(schema_id, text, definition, parsed, answer.get("subject"), answer.get("version"))

    def _answer_id(self, answer: Any, what: str) -> int:
        schema_id = answer.get("id") if isinstance(answer, dict) else None
        if not isinstance(schema_id, int) or isinstance(schema_id, bool):
            raise SchemaRegistryRequestError(self.url, what, 200, None, "the answer has no integer 'id'")
        return schema_id

    def _headers(self, with_body: bool) -> dict[str, str]:
        headers = {"Accept": ACCEPT}
        if with_body:
            headers["Content-Type"] = CONTENT_TYPE
        if self.auth is not None:
            token = base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode("ascii")
            headers["Authorization"] = f"Basic {token}"
        return headers

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        """One request; the JSON answer, or the adapter's error for a failure."""
        data = None if body is None else json.dumps(body).encode()
        request = Request(self.url + path, data=data, method=method, headers=self._headers(data is not None))
        what = f"{method} {path}"
        try:
            with urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except HTTPError as exc:
            raise self._refusal(what, exc) from None
        except (URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise SchemaRegistryUnavailable(self.url, f"{what}: {type(exc).__name__}: {reason}") from None
        except ValueError:
            raise SchemaRegistryUnavailable(self.url, f"{what}: the answer is not JSON") from None

    def _refusal(self, what: str, exc: HTTPError) -> Exception:
        try:
            answer = json.loads(exc.read())
        except (ValueError, OSError):
            answer = {}
        answer = answer if isinstance(answer, dict) else {}
        code = answer.get("error_code")
        code = code if isinstance(code, int) else None
        message = str(answer.get("message") or exc.reason)
        if exc.code >= SERVER_ERROR_STATUS or exc.code in RETRYABLE_STATUS:
            return SchemaRegistryUnavailable(self.url, f"{what}: HTTP {exc.code}: {message}")
        error = SubjectNotFoundError if code == SUBJECT_NOT_FOUND else SchemaRegistryRequestError
        return error(self.url, what, exc.code, code, message)


def _rebuild_client(url: str, auth: tuple[str, str] | None, timeout: float) -> SchemaRegistryClient:
    return SchemaRegistryClient(url, auth=auth, timeout=timeout)
