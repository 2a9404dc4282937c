"""An in-process HTTP double of the Confluent Schema Registry REST subset the project uses.

Only for what a real registry cannot be made to do on demand here: server errors and outages
(`fail_next`), counting the requests a client makes (`requests`, to test its caches), and HTTPS
with basic or bearer auth and client certificates (Apicurio Registry's authentication needs an
OpenID Connect server). Everything else runs against Apicurio Registry (`tests.support.registry.apicurio`).

Serves, with Confluent's response shapes and error codes:
  GET  /schemas/ids/{id}                  {"schema": text}            40403 Schema not found
  POST /subjects/{subject}/versions       {"id": id}                  42201 Invalid schema
  POST /subjects/{subject}/versions       {"id": id}                  42201 Invalid schema, 409 incompatible
  GET  /subjects/{subject}/versions/{v}   {"subject","version","id","schema"}  40401/40402 not found
  GET  /subjects                          [subject, ...]
Ids are assigned incrementally; one schema text (compared in compact canonical JSON) has one
id across subjects, and registering it again under a subject returns that id without a new
version. Schema references ({"name", "subject", "version"}) are resolved as named types.
A new version must pass the subject's compatibility check against the latest version:
BACKWARD by default (the new schema reads data written with the latest one), or NONE.
Optional HTTPS (`tls=(certfile, keyfile)`, client certificates required with `client_ca`) and
basic or bearer auth (401, error code 40101).
`fail_next` makes the next requests answer with a server error, to exercise retry paths.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import unquote

import fastavro

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
SCHEMA_BY_ID = re.compile(r"^/schemas/ids/(\d+)$")
SUBJECT_VERSIONS = re.compile(r"^/subjects/([^/]+)/versions$")
SUBJECT_VERSION = re.compile(r"^/subjects/([^/]+)/versions/(latest|\d+)$")
SUBJECTS = re.compile(r"^/subjects$")
GET_SCHEMA, GET_LATEST, LIST_SUBJECTS, REGISTER = "get_schema", "get_latest", "list_subjects", "register"
Compatibility = Literal["BACKWARD", "NONE"]


class Incompatible(Exception):
    """A new schema cannot read data written with the latest one."""


class RegistryState:
    """Schemas by id and subjects' versions; all access under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.texts: dict[int, str] = {}
        self.references: dict[int, list[dict]] = {}
        self.ids: dict[str, int] = {}
        self.subjects: dict[str, list[int]] = {}

    def register(self, subject: str, text: str, references: list[dict], compatibility: Compatibility) -> int:
        """The id of `text` (new or existing), added as a version of `subject` if it is not one;
        raises `Incompatible` when the subject's latest version cannot be read with it."""
        with self.lock:
            schema_id = self.ids.get(text)
            versions = self.subjects.setdefault(subject, [])
            if schema_id is not None and schema_id in versions:
                return schema_id
            if versions and compatibility == "BACKWARD":
                check_backward(self.named(references), self.texts[versions[-1]], text,
                               self.named(self.references[versions[-1]]))
            if schema_id is None:
                schema_id = len(self.texts) + 1
                self.ids[text], self.texts[schema_id] = schema_id, text
                self.references[schema_id] = references
            versions.append(schema_id)
            return schema_id

    def named(self, references: list[dict]) -> dict[str, Any]:
        """fastavro named types of `references` (caller holds the lock); KeyError if one is missing."""
        named: dict[str, Any] = {}
        for reference in references:
            schema_id = self.subjects[reference["subject"]][int(reference["version"]) - 1]
            named.update(self.named(self.references[schema_id]))
            fastavro.parse_schema(json.loads(self.texts[schema_id]), named_schemas=named)
        return named


def check_backward(named: dict[str, Any], old: str, new: str, old_named: dict[str, Any]) -> None:
    """Raise `Incompatible` unless a reader with `new` reads data written with `old`: fastavro
    resolves the schemas on a value with every field at its default, or null."""
    writer = fastavro.parse_schema(json.loads(old), named_schemas=dict(old_named))
    reader = fastavro.parse_schema(json.loads(new), named_schemas=dict(named))
    if not _resolvable(writer, reader):
        raise Incompatible("the new schema cannot read data written with the latest version")


def _resolvable(writer: Any, reader: Any) -> bool:
    """Schema resolution of record fields (Avro spec): a reader field missing from the writer
    needs a default; a field both have must have the same type or a promotable one."""
    if isinstance(writer, dict) and isinstance(reader, dict) and writer.get("type") == reader.get("type") == "record":
        written = {field["name"]: field for field in writer["fields"]}
        for field in reader["fields"]:
            if field["name"] not in written:
                if "default" not in field:
                    return False
            elif not _resolvable(written[field["name"]]["type"], field["type"]):
                return False
        return True
    if isinstance(reader, list):
        return all(any(_resolvable(w, r) for r in reader) for w in (writer if isinstance(writer, list) else [writer]))
    if isinstance(writer, list):
        return False
    return _type_name(writer) == _type_name(reader) or (_type_name(writer), _type_name(reader)) in PROMOTIONS


PROMOTIONS = {("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"), ("long", "double"),
              ("float", "double"), ("string", "bytes"), ("bytes", "string")}


def _type_name(schema: Any) -> str:
    if isinstance(schema, dict):
        return str(schema.get("name") or schema.get("type"))
    return str(schema)


def _canonical(text: Any, named: dict[str, Any]) -> str | None:
    """Compact JSON of a valid Avro schema text, `None` when it is not one."""
    try:
        definition = json.loads(text)
        fastavro.parse_schema(definition, named_schemas=dict(named))
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
        if double.auth_required and self.headers.get("Authorization") != double.auth_header:
            self._error(401, 40101, "Unauthorized")
            return False
        return True

    def _schema_by_id(self, match: re.Match) -> None:
        state = self.server.double.state
        text = state.texts.get(int(match[1]))
        if text is None:
            return self._error(404, 40403, "Schema not found")
        self._answer(200, {"schema": text, **_references(state.references[int(match[1])])})

    def _version(self, match: re.Match) -> None:
        state, subject = self.server.double.state, unquote(match[1])
        with state.lock:
            versions = list(state.subjects.get(subject, ()))
        if not versions:
            return self._error(404, 40401, f"Subject '{subject}' not found.")
        version = len(versions) if match[2] == "latest" else int(match[2])
        if not 1 <= version <= len(versions):
            return self._error(404, 40402, f"Version {version} not found.")
        schema_id = versions[version - 1]
        self._answer(200, {"subject": subject, "version": version, "id": schema_id,
                           "schema": state.texts[schema_id], **_references(state.references[schema_id])})

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
        references = [{k: r[k] for k in ("name", "subject", "version")} for r in body.get("references") or []
                      ] if kind == "AVRO" else []
        double, subject = self.server.double, unquote(match[1])
        try:
            with double.state.lock:
                named = double.state.named(references)
        except (KeyError, IndexError, ValueError):
            return self._error(422, 42201, "Invalid schema: a reference is not registered")
        text = _canonical(body.get("schema"), named) if kind == "AVRO" else None
        if text is None:
            return self._error(422, 42201, "Invalid schema")
        try:
            schema_id = double.state.register(subject, text, references, double.compatibility)
        except Incompatible as refused:
            return self._error(409, 409, f"Schema being registered is incompatible with an earlier schema for "
                                         f"subject \"{subject}\", details: [{refused}]")
        self._answer(200, {"id": schema_id})

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
    ("GET", GET_LATEST, SUBJECT_VERSION, _Handler._version),
    ("GET", LIST_SUBJECTS, SUBJECTS, _Handler._subjects),
    ("POST", REGISTER, SUBJECT_VERSIONS, _Handler._register),
)
"""(method, route name counted in `SchemaRegistryDouble.requests`, path pattern, handler)."""


def _references(references: list[dict]) -> dict[str, Any]:
    return {"references": references} if references else {}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    double: "SchemaRegistryDouble"


class SchemaRegistryDouble:
    """A running registry double on 127.0.0.1; use as a context manager, or `start`/`stop`."""

    def __init__(self, port: int = 0, auth: tuple[str, str] | None = None, *,
                 tls: tuple[str, str] | None = None, client_ca: str | None = None, bearer_token: str | None = None,
                 compatibility: Compatibility = "BACKWARD") -> None:
        self.state = RegistryState()
        self.compatibility = compatibility
        self.scheme = "https" if tls else "http"
        self.requests: Counter[str] = Counter()
        self.auth = auth
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode() if auth else ""
        self.auth_header = f"Bearer {bearer_token}" if bearer_token else f"Basic {token}"
        self.auth_required = auth is not None or bearer_token is not None
        self._failures = 0
        self._failures_lock = threading.Lock()
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.double = self
        if tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*tls)
            if client_ca is not None:
                context.verify_mode = ssl.CERT_REQUIRED
                context.load_verify_locations(client_ca)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, name="schema-registry-double", daemon=True)

    @property
    def url(self) -> str:
        """Base URL of the double, e.g. http://127.0.0.1:41234."""
        host, port = self._server.server_address[:2]
        return f"{self.scheme}://{host}:{port}"

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

