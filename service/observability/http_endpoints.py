"""The service's HTTP port: `/metrics` (Prometheus exposition), `/healthz` and `/readyz`.

- `/metrics`: every metric of the default registry, in the format the scraper asks for.
- `/healthz`: 200 while the process serves HTTP at all (liveness).
- `/readyz`: 200 when every pipeline is ready, else 503; the JSON body names each pipeline and
  why it is not ready (service/observability/health.py). A readiness check that fails is reported as unready.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import urlsplit

from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder

from service.observability.health import PipelineHealth, Readiness

log = logging.getLogger(__name__)
JSON = "application/json"


class _Handler(BaseHTTPRequestHandler):
    """Routes the three paths; everything else is 404."""

    readiness: Callable[[], Readiness]

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        path = urlsplit(self.path).path.rstrip("/") or "/"
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._reply(200, content_type, encoder(REGISTRY))
        elif path == "/healthz":
            self._reply(200, JSON, b'{"alive": true}')
        elif path == "/readyz":
            self._reply(*self._readiness())
        else:
            self._reply(404, "text/plain; charset=utf-8", b"not found: /metrics, /healthz, /readyz\n")

    def _readiness(self) -> tuple[int, str, bytes]:
        try:
            readiness = type(self).readiness()
            ready, document = readiness.ready, readiness.as_dict()
        except Exception as error:  # noqa: BLE001 - a failed check is an unready answer, not a crash
            log.warning("readiness check failed: %s", error)
            failed = Readiness((PipelineHealth("(service)", False, f"readiness check failed: {error}"),))
            ready, document = False, failed.as_dict()
        return 200 if ready else 503, JSON, json.dumps(document).encode()

    def _reply(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the stdlib's signature
        """Requests are not logged (a scraper and probes call every few seconds)."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True


def serve_endpoints(port: int, address: str, readiness: Callable[[], Readiness]) -> ThreadingHTTPServer:
    """Start the endpoints on `address:port` in a daemon thread; `shutdown()` on the result stops them."""
    handler = type("Handler", (_Handler,), {"readiness": staticmethod(readiness)})
    server = _Server((address, port), handler)
    threading.Thread(target=server.serve_forever, name="http-endpoints", daemon=True).start()
    return server
