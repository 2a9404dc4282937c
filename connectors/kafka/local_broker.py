"""The embedded local broker: noida-db (a Kafka-protocol server) as a subprocess on 127.0.0.1."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from connectors.kafka.errors import KafkaUnavailable
from connectors.subprocesses import stop_group
from vocabulary.errors import ConfigError

_READY_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 30.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _executable() -> str:
    beside = Path(sys.executable).with_name("noida-db")
    found = str(beside) if beside.exists() else shutil.which("noida-db")
    if not found:
        raise ConfigError(
            "the embedded broker (noida-db) is not installed: it comes with the `demo` extra, "
            "pip install 'cdc-lakehouse[demo]' (or bash scripts/demo.sh)"
        )
    return found


class LocalBroker:
    """A Kafka-protocol broker owned by this process; data lives under `data_dir`."""

    def __init__(self, data_dir: str | Path, port: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self._process: subprocess.Popen | None = None

    @property
    def bootstrap_servers(self) -> str:
        """host:port for Kafka clients."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> "LocalBroker":
        """Start the broker and wait until it accepts connections."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            _executable(), "start", "--data-dir", str(self.data_dir),
            "--only", "kafka", "--kafka-port", str(self.port), "--host", "127.0.0.1",
        ]
        log = open(self.data_dir / "broker.log", "ab")
        self._process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise KafkaUnavailable(f"local broker exited early; see {self.data_dir / 'broker.log'}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise KafkaUnavailable(f"local broker did not listen on {self.bootstrap_servers} in time")

    def stop(self) -> None:
        """Stop the broker (SIGINT lets it save its data), killing it if it hangs."""
        process, self._process = self._process, None
        stop_group(process, signal.SIGINT, _STOP_TIMEOUT_S)

    def __enter__(self) -> "LocalBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
