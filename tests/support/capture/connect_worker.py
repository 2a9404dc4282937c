"""A Kafka Connect worker in distributed mode, as a JVM subprocess, with the Debezium PostgreSQL plugin.

The worker's jars are the `connect` component of the Maven cache (`connectors.maven_jars`:
connect-runtime, connect-json, connect-transforms and the log4j2 binding); the connector is the
Debezium plugin archive of that component, unpacked, loaded from `plugin.path` in its own class
loader as a deployed worker loads it. Nothing of Debezium is on the worker's class path.

`ConnectWorker(workdir, bootstrap).start()` writes `worker.properties` (its own group and
config/offset/status topics, replication factor 1, REST listener on a free 127.0.0.1 port) and
waits until `GET /health` says the worker finished its start-up (joined its group, read its config
topic). Then the REST API: `create_connector` POSTs a connector's JSON (retrying while the group
rebalances), `wait_running` waits for the connector and every task to be RUNNING,
`source_offsets` reads the offsets it committed, `stop` ends the JVM (SIGTERM: the worker stops
its tasks and leaves its group; SIGKILL if it hangs).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from connectors.kafka.local_broker import free_port
from connectors.maven_jars import archive_dir, lib_jars
from connectors.subprocesses import stop_group

MAIN = "org.apache.kafka.connect.cli.ConnectDistributed"
DEBEZIUM_PLUGIN = "debezium-connector-postgres"
JVM_OPTIONS = ("-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-Djava.awt.headless=true")
READY_TIMEOUT_S = 180.0
RUNNING_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 30.0
POLL_S = 0.2
# Kafka Connect answers 409 while its group rebalances and 5xx while a request is forwarded to a
# leader that is not there yet: both pass.
RETRIED_STATUSES = (409, 500, 502, 503, 504)
# log4j2's properties format: its YAML format needs jackson-dataformat-yaml, not a Connect dependency.
LOG4J2 = """status = warn
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
logger.debezium.name = io.debezium
logger.debezium.level = INFO
logger.worker.name = org.apache.kafka.connect.runtime.Worker
logger.worker.level = INFO
"""


def worker_properties(bootstrap: str, port: int, group: str, plugin_path: Path) -> dict[str, str]:
    """A distributed worker on one broker: production settings except replication factor 1, one
    partition for the offset and status topics, offsets flushed each second (not each minute), and
    plugins discovered through their ServiceLoader manifests only."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "config.storage.topic": f"{group}-configs",
        "offset.storage.topic": f"{group}-offsets",
        "status.storage.topic": f"{group}-status",
        "config.storage.replication.factor": "1",
        "offset.storage.replication.factor": "1",
        "status.storage.replication.factor": "1",
        "offset.storage.partitions": "1",
        "status.storage.partitions": "1",
        "offset.flush.interval.ms": "1000",
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "listeners": f"http://127.0.0.1:{port}",
        "rest.advertised.host.name": "127.0.0.1",
        "rest.advertised.port": str(port),
        "plugin.path": str(plugin_path),
        # Every plugin here (Connect's own, Debezium's) has ServiceLoader manifests: the default
        # discovery (hybrid_warn) also scans every class by reflection, 28 of a 49 s start on this
        # machine, and then itself recommends this setting.
        "plugin.discovery": "service_load",
    }


class ConnectError(RuntimeError):
    """The worker did not start, or its REST API answered an error (`status`: the HTTP status)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ConnectWorker:
    """One Kafka Connect worker owned by this process; its files live under `workdir`."""

    def __init__(self, workdir: Path, bootstrap: str, java: str = "java") -> None:
        self.workdir = workdir
        self.bootstrap = bootstrap
        self.java = java
        self.port = free_port()
        self.group = f"connect-{uuid.uuid4().hex[:8]}"
        self.log = workdir / "connect.log"
        self.process: subprocess.Popen | None = None
        self.startup_seconds: float | None = None

    @property
    def url(self) -> str:
        """The REST API's base URL."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def offsets_topic(self) -> str:
        """Where the worker commits its source connectors' offsets."""
        return f"{self.group}-offsets"

    def start(self) -> "ConnectWorker":
        """Write the worker's files, start its JVM and wait until `/health` says it is ready."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        plugin_path = archive_dir("connect", DEBEZIUM_PLUGIN)
        properties = worker_properties(self.bootstrap, self.port, self.group, plugin_path)
        (self.workdir / "worker.properties").write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
        (self.workdir / "log4j2.properties").write_text(LOG4J2)
        classpath = os.pathsep.join(str(jar) for jar in lib_jars("connect"))
        command = [self.java, *JVM_OPTIONS, f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
                   "-cp", classpath, MAIN, str(self.workdir / "worker.properties")]
        started = time.monotonic()
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(command, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        self.wait_for(lambda: self._health() == "healthy", "ready (GET /health)", READY_TIMEOUT_S)
        self.startup_seconds = time.monotonic() - started
        return self

    def _health(self) -> str | None:
        try:
            return self.request("GET", "/health").get("status")
        except (OSError, ConnectError):  # not listening yet, or 503 while starting
            return None

    def request(self, method: str, path: str, body: dict | None = None) -> dict | list:
        """One REST call; the decoded JSON answer. ConnectError on an HTTP error status."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
                text = answer.read()
        except urllib.error.HTTPError as error:
            raise ConnectError(f"{method} {path}: HTTP {error.code} {error.read()[:500]!r}", error.code) from error
        return json.loads(text) if text else {}

    def create_connector(self, connector: dict, timeout: float = RUNNING_TIMEOUT_S) -> None:
        """POST /connectors with `{"name": ..., "config": {...}}`, retrying while the group rebalances
        (done as soon as the worker lists the connector: a POST answered too late may have created it)."""
        def created() -> bool:
            try:
                self.request("POST", "/connectors", connector)
                return True
            except ConnectError as error:
                if error.status not in RETRIED_STATUSES:
                    raise
                return bool(self.status(connector["name"]))

        self.wait_for(created, f"connector {connector['name']} created", timeout)

    def status(self, name: str) -> dict:
        """GET /connectors/<name>/status ({} while it is not known yet)."""
        try:
            return self.request("GET", f"/connectors/{name}/status")
        except ConnectError:
            return {}

    def wait_running(self, name: str, timeout: float = RUNNING_TIMEOUT_S) -> dict:
        """Until the connector and all its tasks (at least one) are RUNNING; the status.
        A FAILED connector or task fails at once, with its trace."""
        def running() -> bool:
            status = self.status(name)
            states = [status.get("connector", {}), *status.get("tasks", [])]
            failed = [s.get("trace", "")[-3000:] for s in states if s.get("state") == "FAILED"]
            if failed:
                raise ConnectError(f"connector {name} failed:\n" + "\n".join(failed))
            return len(states) > 1 and all(s.get("state") == "RUNNING" for s in states)

        self.wait_for(running, f"connector {name} and its tasks RUNNING", timeout)
        return self.status(name)

    def delete_connector(self, name: str) -> None:
        """DELETE /connectors/<name> (stops its tasks; its committed offsets stay)."""
        self.request("DELETE", f"/connectors/{name}")

    def source_offsets(self, name: str) -> list[dict]:
        """GET /connectors/<name>/offsets: the source offsets the worker has committed, as
        `{"partition": {...}, "offset": {...}}` (a record's offset is committed only once Kafka
        acknowledged it and every record the task produced before it)."""
        return self.request("GET", f"/connectors/{name}/offsets")["offsets"]

    def rss_bytes(self, peak: bool = False) -> int:
        """The worker JVM's resident set size now (`peak`: its high-water mark so far)."""
        field = "VmHWM:" if peak else "VmRSS:"
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024
        raise ConnectError(f"no {field} for the worker")

    def wait_for(self, done, what: str, timeout: float) -> None:
        """Poll `done()` until true; ConnectError (with the log tail) on time-out or if the worker exited."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            if done():
                return
            time.sleep(POLL_S)
        raise ConnectError(f"Kafka Connect: {what} not reached in {timeout}s (exit {self.process.poll()}); "
                           f"log tail:\n{self.log.read_text(errors='replace')[-3000:]}")

    def stop(self) -> None:
        """SIGTERM to the worker's process group, SIGKILL if it has not left in time; a no-op once gone."""
        process, self.process = self.process, None
        stop_group(process, signal.SIGTERM, STOP_TIMEOUT_S)

    def __enter__(self) -> "ConnectWorker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
