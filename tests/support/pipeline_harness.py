"""Helpers for tests that run pipelines: configs, the CLI as a subprocess, reading tables back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from deltalake import DeltaTable

from connectors.delta.table_scan import scan

CLI = str(Path(sys.executable).with_name("cdc-lakehouse"))


def write_config(path: Path, bootstrap: str, workdir: Path, pipelines: list[dict], engine: str = "delta-rs",
                 **extra) -> Path:
    """A YAML config with tables (written by Delta `engine`) and checkpoints under `workdir`."""
    config = {
        "kafka": {"bootstrap_servers": bootstrap},
        "lakehouse": {"root": str(workdir / "tables"), "engine": engine},
        "checkpoint_root": str(workdir / "checkpoints"),
        "spark": {"master": "local[2]", "shuffle_partitions": 2},
        "pipelines": pipelines,
        **extra,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def run_cli(config: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`cdc-lakehouse run CONFIG ARGS` to completion."""
    return subprocess.run([CLI, "run", str(config), *args], capture_output=True, text=True, timeout=timeout)


def start_cli(config: Path, *args: str, log: Path) -> subprocess.Popen:
    """`cdc-lakehouse run CONFIG ARGS` in its own process group (so a kill takes the JVM too)."""
    handle = open(log, "w")
    return subprocess.Popen([CLI, "run", str(config), *args], stdout=handle, stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ})


def kill_group(process: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to the whole process group of `process` and reap it."""
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
    process.wait(timeout=120)


def table_rows(uri: str | Path, order_by: str = "id") -> list[dict]:
    """The Delta table read back with a Delta reader, sorted."""
    return sorted(scan(DeltaTable(str(uri))).read_all().to_pylist(), key=lambda r: r[order_by])


def table_version(uri: str | Path) -> int:
    """Current Delta version of the table."""
    return DeltaTable(str(uri)).version()


def wait_for_table(uri: str | Path, done: Callable[[], bool], process: subprocess.Popen, log: Path,
                   timeout: float = 300) -> None:
    """Poll until `done()` holds for the table while `process` keeps running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            if done():
                return
        except Exception:  # noqa: BLE001 - the table may not exist yet
            pass
        time.sleep(0.5)
    raise AssertionError(f"{uri}: condition not reached in {timeout}s; log: {log.read_text()[-3000:]}")


def read_committed(bootstrap: str, topic: str, timeout_s: float = 30.0) -> list:
    """Every committed record of `topic`, each partition read to its end.

    The end is the log end, not the last stable offset: Apache Kafka writes a transaction's
    commit markers after `commit_transaction` returned, so right after a commit the LSO may still
    be below the batch. A read_committed position passes the log end only once every transaction
    below it is decided; a transaction left open makes this wait until `timeout_s`.
    """
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{topic}",
                         "isolation.level": "read_committed", "enable.auto.commit": "false",
                         "session.timeout.ms": "6000"})
    log_ends = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ends-{topic}",
                         "isolation.level": "read_uncommitted"})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = {p: log_ends.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                for p in partitions}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        pending, records, deadline = {p for p, end in ends.items() if end > 0}, [], time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                records.append(message)
            done = consumer.position([TopicPartition(topic, p) for p in pending])
            pending -= {tp.partition for tp in done if tp.offset >= ends[tp.partition]}
        assert not pending, f"partitions {pending} of {topic} not read to their end"
        return records
    finally:
        consumer.close()
        log_ends.close()
