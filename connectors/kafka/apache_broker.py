"""Apache Kafka, one KRaft node (broker and controller in one JVM), as a subprocess on 127.0.0.1.

The jars come from the Maven cache (`connectors.maven_jars`, component `kafka`). The first start
writes `server.properties` with two free ports and formats the log directory (`kafka.tools.StorageTool
format --standalone`, in a JVM of its own: the tool calls exit); a later start on the same
directory reuses both, so a broker killed with SIGKILL comes back with its log, its ports and its
cluster id, as a restarted production broker does. Ready means a metadata request answers with
this broker in it.

Settings are production defaults except what one node needs (replication factor 1, min ISR 1 for
the internal topics) and what a test broker should not pay for: internal topics with 4 partitions
instead of 50 (their creation on first use is the slowest part of a first transaction or group),
no initial rebalance delay, and a small heap.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from base64 import urlsafe_b64encode
from pathlib import Path

from connectors.kafka.errors import KafkaUnavailable
from connectors.kafka.local_broker import free_port
from connectors.maven_jars import lib_jars
from connectors.subprocesses import stop_group

_READY_TIMEOUT_S = 120.0
_STOP_TIMEOUT_S = 60.0
_MAIN = "kafka.Kafka"
_STORAGE_TOOL = "kafka.tools.StorageTool"
_JVM_OPTIONS = ("-Xms64m", "-Xmx768m", "-XX:+UseSerialGC", "-Djava.awt.headless=true")
_LOG4J2 = """Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.server.KafkaServer
        level: INFO
      - name: kafka.server.BrokerServer
        level: INFO
"""


def _cluster_id() -> str:
    """16 random bytes, URL-safe base64 without padding, not starting with '-' (as StorageTool's)."""
    while True:
        text = urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def server_properties(log_dir: Path, port: int, controller_port: int) -> str:
    """The broker's configuration: one combined KRaft node on loopback."""
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(log_dir),
        "num.partitions": "1",
        "auto.create.topics.enable": "true",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


class ApacheKafkaBroker:
    """An Apache Kafka broker owned by this process; its log, config and ports live under `data_dir`."""

    def __init__(self, data_dir: str | Path, java: str = "java") -> None:
        self.data_dir = Path(data_dir)
        self.java = java
        self._process: subprocess.Popen | None = None
        self.port, self.controller_port = self._ports()

    @property
    def bootstrap_servers(self) -> str:
        """host:port for Kafka clients."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The broker JVM's process id while it runs."""
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    @property
    def _config(self) -> Path:
        return self.data_dir / "server.properties"

    def _ports(self) -> tuple[int, int]:
        if self._config.is_file():
            values = dict(line.split("=", 1) for line in self._config.read_text().splitlines() if "=" in line)
            return int(values["listeners"].split(",")[0].rsplit(":", 1)[1]), int(
                values["controller.quorum.bootstrap.servers"].rsplit(":", 1)[1])
        return free_port(), free_port()

    def _java(self, main: str, *args: str) -> list[str]:
        classpath = os.pathsep.join(str(jar) for jar in lib_jars("kafka"))
        return [self.java, *_JVM_OPTIONS, f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.yaml'}",
                "-cp", classpath, main, *args]

    def _format_once(self) -> None:
        log_dir = self.data_dir / "log"
        if (log_dir / "meta.properties").is_file():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "log4j2.yaml").write_text(_LOG4J2)
        self._config.write_text(server_properties(log_dir, self.port, self.controller_port))
        done = subprocess.run(
            self._java(_STORAGE_TOOL, "format", "--standalone", "-t", _cluster_id(), "-c", str(self._config)),
            capture_output=True, text=True, timeout=120,
        )
        if done.returncode != 0:
            raise KafkaUnavailable(f"formatting the Kafka log directory failed: {done.stderr.strip()[-500:]}")

    def start(self) -> "ApacheKafkaBroker":
        """Start the broker (formatting its directory the first time) and wait until it answers."""
        self._format_once()
        log = open(self.data_dir / "broker.log", "ab")
        self._process = subprocess.Popen(
            self._java(_MAIN, str(self._config)), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        log.close()
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise KafkaUnavailable(f"Apache Kafka exited early; see {self.data_dir / 'broker.log'}")
            try:
                if admin.list_topics(timeout=1).brokers:
                    return
            except Exception:  # noqa: BLE001 - not answering yet
                time.sleep(0.1)
        self.kill()
        raise KafkaUnavailable(f"Apache Kafka did not answer on {self.bootstrap_servers} in time")

    def stop(self) -> None:
        """Stop the broker gracefully (SIGTERM: controlled shutdown), killing it if it hangs."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the broker: no shutdown, only what the OS already has of its log survives."""
        self._signal(signal.SIGKILL)

    def _signal(self, sig: signal.Signals) -> None:
        process, self._process = self._process, None
        stop_group(process, sig, _STOP_TIMEOUT_S)

    def __enter__(self) -> "ApacheKafkaBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
