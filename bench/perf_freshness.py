"""Freshness: event-to-Delta latency of `cdc-lakehouse run` (1 s trigger) under a steady input rate.

The input is inserts and updates only (`chaos_workload.ClaimWorkload`), so every event has a row
image of its own in the table: its email carries the workload's version clock. An event counts
as in Delta at the first commit whose change feed holds a row image of its key at that clock or
a later one (an update superseded within one micro-batch is in Delta with its successor). Its
latency is that commit's timestamp (commitInfo, via `DeltaTable.history`) minus the time the
producer handed the record to librdkafka.
"""

from __future__ import annotations

import bisect
import random
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from chaos_workload import ClaimWorkload
from confluent_kafka import Producer
from deltalake import DeltaTable
from cpu_samples import tree_rss_mib
from ingest_benchmark import _BATCH_LINE, _log_time

from service.operations.workload import Event, produce

_CLOCK = re.compile(r"\.(\d+)@")
_TICK_S = 0.05
_RSS_SAMPLE_S = 0.5
_POLL_S = 1.0
_STOP_TIMEOUT_S = 120.0
_IMAGES = ("insert", "update_postimage")


@dataclass(frozen=True)
class Sent:
    """One produced event: its key, the clock of its row image, when it was produced (epoch s)."""

    key: int
    clock: int
    at: float


def _clock(email: str) -> int:
    return int(_CLOCK.search(email).group(1))


class UpsertStream:
    """Inserts of new keys and updates of live ones, over `keys` keys; the expected emails per key."""

    def __init__(self, topic: str, partitions: int, keys: int, seed: int = 13) -> None:
        self.workload = ClaimWorkload(topic, partitions, "mixed", seed=seed)
        self.keys, self._rng = keys, random.Random(seed + 1)

    def events(self, count: int) -> list[tuple[Event, int, int]]:
        """`count` (event, key, clock) in order."""
        out = []
        for _ in range(count):
            key = self._rng.randrange(self.keys)
            (event,) = self.workload.update(key) if key in self.workload.table else self.workload.next_events(key)
            out.append((event, key, _clock(self.workload.table[key]["email"])))
        return out


class PacedProducer(threading.Thread):
    """Produces events at a steady rate (ticks of 50 ms) and records when each one was produced."""

    def __init__(self, bootstrap: str, events: list[tuple[Event, int, int]], rate: float) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.events, self.rate = bootstrap, events, rate
        self.sent: list[Sent] = []
        self.seconds = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5, "enable.idempotence": True,
                                 # room for every event of a phase: a send never waits for the queue
                                 "queue.buffering.max.messages": max(100_000, len(self.events)),
                                 "queue.buffering.max.kbytes": 2 * 1024 * 1024})
            began = time.monotonic()
            while len(self.sent) < len(self.events):
                due = min(len(self.events), int(self.rate * (time.monotonic() - began)) + 1)
                now = time.time()
                for event, key, clock in self.events[len(self.sent):due]:
                    producer.produce(event.topic, value=event.value, key=event.key, partition=event.partition)
                    self.sent.append(Sent(key, clock, now))
                producer.poll(0)
                time.sleep(_TICK_S)
            self.seconds = time.monotonic() - began
            if producer.flush(60):
                raise RuntimeError("records were not acknowledged by the broker")
        except BaseException as error:  # noqa: BLE001 - reported by the benchmark
            self.error = error


@dataclass
class Service:
    """`cdc-lakehouse run CONFIG` (no --until-idle) with its peak process-tree RSS sampled."""

    cli: str
    config: Path
    log: Path
    launched: float = 0.0
    peak_rss_mib: float = 0.0
    process: subprocess.Popen | None = None
    _done: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        """Launch the service and the RSS sampler."""
        handle = open(self.log, "w")
        self.launched = time.time()
        self.process = subprocess.Popen([self.cli, "run", str(self.config)], stdout=handle, stderr=subprocess.STDOUT)
        handle.close()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self._done.wait(_RSS_SAMPLE_S):
            self.peak_rss_mib = max(self.peak_rss_mib, tree_rss_mib(self.process.pid))

    def first_commit(self, timeout: float) -> float:
        """Seconds from launch to the first `batch N ->` log line."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            found = _BATCH_LINE.search(self.log.read_text())
            if found:
                return _log_time(found.group(1)) - self.launched
            time.sleep(_POLL_S)
        raise SystemExit(f"FAILED: no committed batch within {timeout:.0f} s; see {self.log}")

    def check_alive(self) -> None:
        """Fail loudly if the service exited."""
        if self.process.poll() is not None:
            raise SystemExit(f"FAILED: the service exited {self.process.returncode}:\n"
                             f"{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        """SIGTERM (a graceful stop), then wait; SIGKILL if it does not end in time."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._done.set()


def wait_drained(uri: str, stream: UpsertStream, service: Service, timeout: float) -> bool:
    """Wait until the table holds every key's latest email; False on timeout."""
    want = {row["email"] for row in stream.workload.table.values()}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        service.check_alive()
        try:
            emails = DeltaTable(uri).to_pyarrow_table(columns=["email"]).column("email")
        except Exception:  # noqa: BLE001 - the table is created by the first batch
            emails = None
        if emails is not None and len(emails) == len(want) and set(emails.to_pylist()) == want:
            return True
        time.sleep(_POLL_S)
    return False


def latencies(uri: str, sent: list[Sent]) -> list[float]:
    """Per event, seconds from production to the commit of the first Delta version holding it."""
    table = DeltaTable(uri)
    commits = {entry["version"]: entry["timestamp"] / 1000 for entry in table.history()}
    feed = pa.table(table.load_cdf(starting_version=0, columns=["id", "email", "_change_type", "_commit_version"])
                    .read_all())
    images: dict[int, list[tuple[int, int]]] = {}
    for key, email, kind, version in zip(*(feed.column(c).to_pylist() for c in feed.column_names)):
        if kind in _IMAGES:
            images.setdefault(key, []).append((_clock(email), version))
    for seen in images.values():
        seen.sort()
    out = []
    for event in sent:
        seen = images.get(event.key, [])
        at = bisect.bisect_left(seen, (event.clock, -1))
        if at == len(seen):
            raise SystemExit(f"FAILED: key {event.key} at clock {event.clock} never reached Delta")
        out.append(commits[seen[at][1]] - event.at)
    return out


def percentile(values: list[float], share: float) -> float:
    """The `share` quantile (nearest rank) of `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def phase(bootstrap: str, uri: str, stream: UpsertStream, service: Service, rate: float, seconds: float,
          drain_s: float) -> dict[str, float]:
    """Produce at `rate` events/s for `seconds`, wait for the table, measure the latencies."""
    producer = PacedProducer(bootstrap, stream.events(int(rate * seconds)), rate)
    producer.start()
    producer.join()
    if producer.error is not None:
        raise SystemExit(f"FAILED: producer: {producer.error}")
    drained = wait_drained(uri, stream, service, drain_s)
    figures = {"rate": rate, "seconds": seconds, "events": len(producer.sent),
               "produced_rate": len(producer.sent) / producer.seconds, "drained": drained}
    if drained:
        values = latencies(uri, producer.sent)
        figures.update(p50=percentile(values, 0.5), p95=percentile(values, 0.95), max=max(values))
    return figures


def warm_up(bootstrap: str, stream: UpsertStream, count: int) -> int:
    """Produce a small first input before the service starts (its first batch)."""
    return produce(bootstrap, [event for event, _, _ in stream.events(count)])
