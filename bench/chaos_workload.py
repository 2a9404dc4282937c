"""The chaos benchmark's input: three Debezium topics, produced while the service runs.

- plain: one table's changes on 4 partitions (`service.operations.workload.DebeziumWorkload`).
- dedup A and B: two sources of one table (on_conflict deduplicate), 2 partitions each. Each
  has a key range of its own; an overlap range is claimed by both during the run and settled
  before the end (one side deletes, so at most one claim per key is live); a late range is
  claimed by A at the start, then by B at the end once A's row is in the table, and then
  either kept (B shows), deleted by B (the table rolls back to A) or updated by A once B's row
  is in the table (A's update shows). So every key's final row does not depend on how the
  service orders the two topics, except where the benchmark itself waited for the order.

`Feeder` produces the stream in small chunks in the background at a steady rate until the
chaos is over, through broker kills too: its producers are idempotent (acks=all) and retry a
chunk until the restarted broker acknowledges it, without writing a record twice.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from itertools import islice
from typing import Iterator

from confluent_kafka import Producer

from service.operations.workload import DebeziumWorkload, Event
from vocabulary.changes import DebeziumOp

PLAIN, SOURCE_A, SOURCE_B, EXPORT = "chaos.plain", "chaos.dedup.a", "chaos.dedup.b", "chaos.export"
PARTITIONS = {PLAIN: 4, SOURCE_A: 2, SOURCE_B: 2, EXPORT: 2}
PLAIN_SHARE = 0.6
_CHUNK_INTERVAL_S = 0.5
_ACK_TIMEOUT_S = 300  # outlasts a broker kill and its restart (log recovery) on a loaded machine


class ClaimWorkload(DebeziumWorkload):
    """A DebeziumWorkload that can also be told to update or delete a live key."""

    def update(self, key: int) -> list[Event]:
        """An update of live `key`."""
        before, after = self.table[key], self._row(key)
        self.table[key] = after
        return [self._event(key, self._encode(DebeziumOp.UPDATE, before, after))]

    def delete(self, key: int) -> list[Event]:
        """A delete of live `key` and its tombstone."""
        before = self.table.pop(key)
        return [self._event(key, self._encode(DebeziumOp.DELETE, before, None)), self._event(key, None)]


@dataclass(frozen=True)
class KeyRanges:
    """Primary keys of the dedup table: A's own, B's own, contested during the run, claimed late."""

    own: int
    overlap: int
    late: int

    @property
    def a(self) -> range:
        return range(0, self.own)

    @property
    def b(self) -> range:
        return range(100_000, 100_000 + self.own)

    @property
    def contested(self) -> range:
        return range(200_000, 200_000 + self.overlap)

    @property
    def late_keys(self) -> range:
        return range(300_000, 300_000 + self.late)


class ChaosWorkload:
    """All input of one chaos run, generated from one seed."""

    def __init__(self, seed: int, events: int) -> None:
        rng = random.Random(seed)
        self.rng = random.Random(rng.randrange(2**32))
        self.events = events
        self.plain = ClaimWorkload(PLAIN, PARTITIONS[PLAIN], "never", seed=rng.randrange(2**32))
        self.a = ClaimWorkload(SOURCE_A, PARTITIONS[SOURCE_A], "never", seed=rng.randrange(2**32))
        self.b = ClaimWorkload(SOURCE_B, PARTITIONS[SOURCE_B], "never", seed=rng.randrange(2**32))
        self.plain_keys = max(100, events // 10)
        self.keys = KeyRanges(own=max(50, events // 40), overlap=max(20, events // 200), late=max(12, events // 1000))

    def stream(self) -> Iterator[Event]:
        """Events for as long as the service is killed and the broker restarted: A's claims of the
        late keys first, then random changes (plain 60 %, A and B 20 % each, a fifth of theirs contested)."""
        for key in self.keys.late_keys:
            yield from self.a.next_events(key)
        while True:
            roll = self.rng.random()
            if roll < PLAIN_SHARE:
                yield from self.plain.next_events(self.rng.randrange(self.plain_keys))
                continue
            source, own = (self.a, self.keys.a) if roll < (1 + PLAIN_SHARE) / 2 else (self.b, self.keys.b)
            keys = own if self.rng.random() < 0.8 else self.keys.contested
            yield from source.next_events(self.rng.choice(keys))

    def settle_contested(self) -> list[Event]:
        """One side deletes each contested key both sides hold, so at most one claim stays live."""
        out = []
        for key in self.keys.contested:
            if key in self.a.table and key in self.b.table:
                out += (self.a if self.rng.random() < 0.5 else self.b).delete(key)
        return out

    def late_groups(self) -> tuple[list[int], list[int], list[int]]:
        """The late keys in three groups: B keeps its claim, B deletes it, A updates after B."""
        keys = list(self.keys.late_keys)
        third = len(keys) // 3
        return keys[:third], keys[third:2 * third], keys[2 * third:]

    def late_claims(self) -> list[Event]:
        """B claims every late key (A holds each since the start)."""
        return [e for key in self.keys.late_keys for e in self.b.next_events(key)]

    def after_late_claims(self) -> list[Event]:
        """B deletes its claims of the second group; A updates the third group."""
        _, deleted, updated = self.late_groups()
        return [e for key in deleted for e in self.b.delete(key)] + [e for key in updated for e in self.a.update(key)]

    def filler(self, count: int) -> list[Event]:
        """Changes of A's and B's own keys: they move every dedup partition's event time along."""
        out = []
        for _ in range(count):
            out += self.a.next_events(self.rng.choice(self.keys.a)) + self.b.next_events(self.rng.choice(self.keys.b))
        return out


def send(bootstrap: str, events: list[Event], acked: Counter, timestamp_ms: int | None = None) -> None:
    """Produce in order and wait for every acknowledgement; counts acked records per (topic, partition)."""
    failures: list[str] = []

    def delivered(error, message) -> None:
        if error is None:
            acked[(message.topic(), message.partition())] += 1
        else:
            failures.append(f"{message.topic()}[{message.partition()}]: {error}")

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                         "message.timeout.ms": _ACK_TIMEOUT_S * 1000, "log_level": 2})  # not each refused connection
    for event in events:  # timestamp 0: the producer's clock
        producer.produce(event.topic, value=event.value, key=event.key, partition=event.partition,
                         on_delivery=delivered, timestamp=timestamp_ms or 0)
        producer.poll(0)
    if producer.flush(_ACK_TIMEOUT_S) or failures:
        raise RuntimeError(f"records not acknowledged: {failures[:3] or 'flush timed out'}")


class Feeder(threading.Thread):
    """Produces `stream` at `rate` records/s until stopped; a chunk held up by a broker outage is
    followed by the records that fell due meanwhile."""

    def __init__(self, bootstrap: str, stream: Iterator[Event], rate: float) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.stream, self.rate = bootstrap, stream, rate
        self.acked: Counter = Counter()
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._sent, self._began = 0, time.monotonic()

    def run(self) -> None:
        try:
            while not self._done.is_set():
                due = round(self.rate * (time.monotonic() - self._began)) - self._sent
                events = list(islice(self.stream, max(1, due)))
                send(self.bootstrap, events, self.acked)
                self._sent += len(events)
                self._done.wait(_CHUNK_INTERVAL_S)
        except BaseException as error:  # noqa: BLE001 - reported by the benchmark
            self.error = error

    def finish(self) -> None:
        """Produce no more; returns when the chunk in flight is acknowledged."""
        self._done.set()
        self.join()
