"""An in-process HTTP double of the Confluent Schema Registry REST subset the project uses.

Serves, with Confluent's response shapes and error codes:
  GET  /schemas/ids/{id}                  {"schema": text}            40403 Schema not found
  POST /subjects/{subject}/versions       {"id": id}                  42201 Invalid schema
  GET  /subjects/{subject}/versions/latest {"subject","version","id","schema"}  40401 Subject not found
  GET  /subjects                          [subject, ...]
Ids are assigned incrementally; one schema text (compared in compact canonical JSON) has one
id across subjects, and registering it again under a subject returns that id without a new
version. No compatibility checks. Optional basic auth (401, error code 40101). `fail_next`
makes the next requests answer with a server error, to exercise retry paths.
"""

from __future__ import annotations

import base64
import json
import os
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator
from urllib.parse import unquote

import fastavro
import pytest

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
SCHEMA_BY_ID = re.compile(r"^/schemas/ids/(\d+)$")
SUBJECT_VERSIONS = re.compile(r"^/subjects/([^/]+)/versions$")
SUBJECT_LATEST = re.compile(r"^/subjects/([^/]+)/versions/latest$")
SUBJECTS = re.compile(r"^/subjects$")
GET_SCHEMA, GET_LATEST, LIST_SUBJECTS, REGISTER = "get_schema", "get_latest", "list_subjects", "register"


class RegistryState:
    """Schemas by id and subjects' versions; all access under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.texts: dict[int, str] = {}
        self.ids: dict[str, int] = {}
        self.subjects: dict[str, list[int]] = {}

    def register(self, subject: str, text: str) -> int:
        """The id of `text` (new or existing), added as a version of `subject` if it is not one."""
        with self.lock:
            schema_id = self.ids.get(text)
            if schema_id is None:
                schema_id = len(self.texts) + 1
                self.ids[text], self.texts[schema_id] = schema_id, text
            versions = self.subjects.setdefault(subject, [])
            if schema_id not in versions:
                versions.append(schema_id)
            return schema_id


def _canonical(text: Any) -> str | None:
    """Compact JSON of a valid Avro schema text, `None` when it is not one."""
    try:
        definition = json.loads(text)
        fastavro.parse_schema(definition)
    except (TypeError, ValueError, KeyError, fastavro.schema.SchemaParseException):
        return None
    return json.dumps(definition, separators=(",", ":"))


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep test output quiet
        return

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, code: int, message: str) -> None:
        self._answer(status, {"error_code": code, "message": message})

    def _admitted(self, route: str) -> bool:
        """Count the request under its route name; answer injected failures and bad auth."""
        double = self.server.double
        double.requests[route] += 1
        if double.take_failure():
            self._error(500, 50001, "Error in the backend data store")
            return False
        if double.auth is not None and self.headers.get("Authorization") != double.auth_header:
            self._error(401, 40101, "Unauthorized")
            return False
        return True

    def _schema_by_id(self, match: re.Match) -> None:
        text = self.server.double.state.texts.get(int(match[1]))
        if text is None:
            return self._error(404, 40403, "Schema not found")
        self._answer(200, {"schema": text})

    def _latest(self, match: re.Match) -> None:
        state, subject = self.server.double.state, unquote(match[1])
        with state.lock:
            versions = list(state.subjects.get(subject, ()))
        if not versions:
            return self._error(404, 40401, f"Subject '{subject}' not found.")
        schema_id = versions[-1]
        self._answer(200, {"subject": subject, "version": len(versions), "id": schema_id,
                           "schema": state.texts[schema_id]})

    def _subjects(self, match: re.Match) -> None:
        state = self.server.double.state
        with state.lock:
            subjects = sorted(state.subjects)
        self._answer(200, subjects)

    def _register(self, match: re.Match) -> None:
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        except ValueError:
            return self._error(422, 42201, "Invalid schema: the request is not JSON")
        kind = body.get("schemaType", "AVRO") if isinstance(body, dict) else None
        text = _canonical(body.get("schema")) if kind == "AVRO" else None
        if text is None:
            return self._error(422, 42201, "Invalid schema")
        self._answer(200, {"id": self.server.double.state.register(unquote(match[1]), text)})

    def _route(self, method: str) -> None:
        path = self.path.split("?")[0]
        for route_method, name, pattern, handle in ROUTES:
            match = pattern.match(path) if route_method == method else None
            if match is not None:
                if self._admitted(name):
                    handle(self, match)
                return
        self._error(404, 404, "HTTP 404 Not Found")

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        self._route("POST")


ROUTES = (
    ("GET", GET_SCHEMA, SCHEMA_BY_ID, _Handler._schema_by_id),
    ("GET", GET_LATEST, SUBJECT_LATEST, _Handler._latest),
    ("GET", LIST_SUBJECTS, SUBJECTS, _Handler._subjects),
    ("POST", REGISTER, SUBJECT_VERSIONS, _Handler._register),
)
"""(method, route name counted in `SchemaRegistryDouble.requests`, path pattern, handler)."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    double: "SchemaRegistryDouble"


class SchemaRegistryDouble:
    """A running registry double on 127.0.0.1; use as a context manager, or `start`/`stop`."""

    def __init__(self, port: int = 0, auth: tuple[str, str] | None = None) -> None:
        self.state = RegistryState()
        self.requests: Counter[str] = Counter()
        self.auth = auth
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode() if auth else ""
        self.auth_header = f"Basic {token}"
        self._failures = 0
        self._failures_lock = threading.Lock()
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.double = self
        self._thread = threading.Thread(target=self._server.serve_forever, name="schema-registry-double", daemon=True)

    @property
    def url(self) -> str:
        """Base URL of the double, e.g. http://127.0.0.1:41234."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def fail_next(self, count: int = 1) -> None:
        """Answer the next `count` requests with HTTP 500 (error code 50001)."""
        with self._failures_lock:
            self._failures += count

    def take_failure(self) -> bool:
        """True (and one failure fewer) while injected failures remain."""
        with self._failures_lock:
            if self._failures <= 0:
                return False
            self._failures -= 1
            return True

    def start(self) -> "SchemaRegistryDouble":
        """Serve requests on a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "SchemaRegistryDouble":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture(scope="session")
def schema_registry_url() -> Iterator[str]:
    """Base URL of a Schema Registry: SCHEMA_REGISTRY_URL when set, else an in-process double."""
    if os.environ.get("SCHEMA_REGISTRY_URL"):
        yield os.environ["SCHEMA_REGISTRY_URL"]
        return
    with SchemaRegistryDouble() as registry:
        yield registry.url
