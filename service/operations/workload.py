"""A synthetic Debezium workload (demo, tests, benchmarks) and its expected final table.

Events follow a per-key life cycle: snapshot read (r) or create (c), updates (u), a delete
(d) followed by a Kafka tombstone, possibly re-created later. All events of one key go to
one partition, so replaying them in the order generated gives the table a correct
pipeline must produce.
"""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Iterable, Literal

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from vocabulary.changes import DebeziumOp, Envelope

SchemaMode = Literal["always", "never", "mixed"]
_EPOCH = datetime(1970, 1, 1)
_BASE_TS_US = 1_790_000_000_000_000
_FIELDS = [
    {"field": "id", "type": "int64", "optional": False},
    {"field": "name", "type": "string", "optional": True},
    {"field": "email", "type": "string", "optional": True},
    {"field": "balance", "type": "double", "optional": True},
    {"field": "active", "type": "boolean", "optional": True},
]
_TS_FIELD = {"field": "updated_at", "type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp"}


@dataclass(frozen=True)
class Event:
    """One Kafka record of the workload."""

    topic: str
    partition: int
    key: bytes
    value: bytes | None


def _envelope_schema(fields: list[dict]) -> dict:
    row = {"type": "struct", "optional": True, "fields": fields}
    return {
        "type": "struct",
        "fields": [
            {**row, "field": Envelope.BEFORE},
            {**row, "field": Envelope.AFTER},
            {"type": "string", "optional": False, "field": Envelope.OP},
            {"type": "int64", "optional": True, "field": Envelope.TS_MS},
        ],
    }


class DebeziumWorkload:
    """Generates envelopes for one table keyed by `id` and tracks the expected table."""

    def __init__(self, topic: str, partitions: int, schema: SchemaMode, seed: int = 0,
                 with_timestamp: bool = False) -> None:
        self.topic, self.partitions, self.schema_mode = topic, partitions, schema
        self.with_timestamp = with_timestamp and schema == "always"
        fields = _FIELDS + ([_TS_FIELD] if self.with_timestamp else [])
        self._schema = _envelope_schema(fields)
        self._rng = random.Random(seed)
        self.table: dict[int, dict] = {}
        self._clock = 0

    def _row(self, key: int) -> dict:
        self._clock += 1
        row = {
            "id": key,
            "name": f"user-{key}-{self._rng.randrange(10**6)}",
            "email": f"u{key}.{self._clock}@example.com",
            "balance": round(self._rng.uniform(-1e4, 1e4), 2),
            "active": self._rng.random() < 0.5,
        }
        if self.with_timestamp:
            row["updated_at"] = _BASE_TS_US + self._clock * 1_000_003
        return row

    def _encode(self, op: DebeziumOp, before: dict | None, after: dict | None) -> bytes:
        payload = {Envelope.BEFORE: before, Envelope.AFTER: after, Envelope.OP: op.value,
                   Envelope.TS_MS: 1_790_000_000_000 + self._clock}
        use_schema = self.schema_mode == "always" or (self.schema_mode == "mixed" and self._rng.random() < 0.5)
        document = {Envelope.SCHEMA: self._schema, Envelope.PAYLOAD: payload} if use_schema else payload
        return json.dumps(document, separators=(",", ":")).encode()

    def _event(self, key: int, value: bytes | None) -> Event:
        raw_key = json.dumps({"id": key}).encode()
        return Event(self.topic, zlib.crc32(raw_key) % self.partitions, raw_key, value)

    def next_events(self, key: int, snapshot: bool = False) -> list[Event]:
        """The next change of `key` (and a tombstone after a delete)."""
        current = self.table.get(key)
        if current is None:
            row = self._row(key)
            self.table[key] = row
            op = DebeziumOp.READ if snapshot else DebeziumOp.CREATE
            return [self._event(key, self._encode(op, None, row))]
        if self._rng.random() < 0.2:
            del self.table[key]
            return [self._event(key, self._encode(DebeziumOp.DELETE, current, None)), self._event(key, None)]
        row = self._row(key)
        self.table[key] = row
        return [self._event(key, self._encode(DebeziumOp.UPDATE, current, row))]

    def generate(self, n_events: int, n_keys: int) -> list[Event]:
        """About `n_events` records: a snapshot of the first keys, then random changes."""
        events: list[Event] = []
        for key in range(min(n_keys, n_events // 4)):
            events += self.next_events(key, snapshot=True)
        while len(events) < n_events:
            events += self.next_events(self._rng.randrange(n_keys))
        return events

    def expected_rows(self) -> list[dict]:
        """The table a correct pipeline produces, sorted by id, values as a Delta reader returns them."""
        rows = []
        for key in sorted(self.table):
            row = dict(self.table[key])
            if "updated_at" in row:
                row["updated_at"] = _EPOCH + timedelta(microseconds=row["updated_at"])
            rows.append(row)
        return rows


def create_topics(bootstrap: str, topics: Iterable[str], partitions: int) -> None:
    """Create topics (existing ones are left as they are)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(t, partitions, 1) for t in topics], operation_timeout=30)
    for future in futures.values():
        try:
            future.result()
        except Exception as error:  # noqa: BLE001 - an existing topic is fine
            if "TOPIC_ALREADY_EXISTS" not in str(error):
                raise


def produce(bootstrap: str, events: Iterable[Event]) -> int:
    """Produce events in order (per partition order is what matters) and wait for all acks."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True,
                         "batch.num.messages": 10000})
    count = 0
    for event in events:
        while True:
            try:
                producer.produce(event.topic, value=event.value, key=event.key, partition=event.partition)
                break
            except BufferError:
                producer.poll(0.1)
        count += 1
        if count % 10000 == 0:
            producer.poll(0)
    remaining = producer.flush(60)
    if remaining:
        raise RuntimeError(f"{remaining} records were not acknowledged by the broker")
    return count
