"""The cluster's start-up wait outlasts a master whose status page answers badly while it starts.

The master's web UI is a real server, but what it answers in the instant it starts cannot be had on
demand; a local HTTP server (a double, for that fault only) answers as it may: a connection cut
short, a page that is not JSON, JSON without the workers, then the status with the workers alive.
"""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest

from testbed.spark_cluster import StandaloneCluster

ANSWERS = [b"cut", b"<html>starting</html>", b"{}",
           json.dumps({"workers": [{"state": "ALIVE"}, {"state": "ALIVE"}]}).encode()]


@pytest.fixture
def status_server():
    """A status page that gives ANSWERS in order (the last one from then on)."""
    answers = list(ANSWERS)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = answers.pop(0) if len(answers) > 1 else answers[0]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body) + (100 if body == b"cut" else 0)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], answers
    server.shutdown()
    server.server_close()


def test_start_up_waits_through_bad_answers_of_the_status_page(tmp_path: Path, status_server):
    port, answers = status_server
    cluster = StandaloneCluster(tmp_path, workers=2, start_timeout_s=60)
    cluster.webui_port = port
    cluster._wait_for_workers()
    assert len(answers) == 1  # every bad answer was met and waited through


def test_start_up_names_the_last_bad_answer_when_it_times_out(tmp_path: Path, status_server):
    port, _ = status_server
    cluster = StandaloneCluster(tmp_path, workers=3, start_timeout_s=3)
    cluster.webui_port = port
    with pytest.raises(TimeoutError, match="2 of 3 workers alive"):
        cluster._wait_for_workers()
