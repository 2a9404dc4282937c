"""Checks of the chaos benchmark, computed from what is in Kafka and Delta, not from the service.

- `read_topic`: every record of a topic (each partition to its end) at an isolation level.
- `replay_plain`: the table a Debezium topic implies (last change of each key in partition order).
- `replay_deduplicate`: the table two Debezium topics imply under `on_conflict: deduplicate`: per
  primary key the live claims (one per source topic), the shown one being the claim whose last
  change came last. A Debezium update is a -U then a +U: the retraction removes the claim and the
  add appends it again, so an update moves its claim to the end (materializer.py, rule 2).
- `compare_table`: a Delta table against an expected {key: row}.
- `compare_export`: an export topic (Debezium envelopes, compaction none) against the table's
  change feed: one record per feed change, keyed by (commit version, id).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import AbstractSet

import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from deltalake import DeltaTable

_READ_TIMEOUT_S = 120.0
_EXAMPLES = 5
FEED_OPS = {"insert": "c", "update_postimage": "u", "delete": "d"}


@dataclass(frozen=True)
class Record:
    """One Kafka record as read back."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None


@dataclass
class Comparison:
    """Differences between what a check expected and what it found; examples name keys only."""

    expected: int = 0
    found: int = 0
    lost: int = 0
    duplicated: int = 0
    wrong: int = 0
    extra: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Nothing lost, doubled, wrong or extra."""
        return not (self.lost or self.duplicated or self.wrong or self.extra)

    def note(self, text: str) -> None:
        """Keep the first few examples."""
        if len(self.examples) < _EXAMPLES:
            self.examples.append(text)


def read_topic(bootstrap: str, topic: str, isolation: str = "read_uncommitted") -> list[Record]:
    """Every record of `topic` visible at `isolation`, partition by partition in offset order."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"chaos-check-{time.monotonic_ns()}",
                         "isolation.level": isolation, "enable.auto.commit": False, "log_level": 3})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)[1]
                for p in partitions}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        records: list[Record] = []
        pending, deadline = {p for p, end in ends.items() if end > 0}, time.monotonic() + _READ_TIMEOUT_S
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(10_000, timeout=0.5):
                if message.error() is None:
                    records.append(Record(topic, message.partition() or 0, message.offset() or 0,
                                          message.timestamp()[1], message.key(), message.value()))
            positions = consumer.position([TopicPartition(topic, p) for p in pending])
            pending -= {tp.partition for tp in positions if tp.offset >= ends[tp.partition]}
        if pending:
            raise RuntimeError(f"partitions {sorted(pending)} of {topic} not read to their end")
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def _changes(records: list[Record]):
    """(record, id, op, after) of each Debezium envelope; tombstones are skipped."""
    for record in records:
        if record.value is None:
            continue
        envelope = json.loads(record.value)
        row = envelope["after"] or envelope["before"]
        yield record, row["id"], envelope["op"], envelope["after"]


def replay_plain(records: list[Record]) -> dict[int, dict]:
    """The table a Debezium topic implies: each key's last change in partition order (a key lives in one)."""
    table: dict[int, dict] = {}
    for _, key, op, after in _changes(records):
        if op == "d":
            table.pop(key, None)
        else:
            table[key] = after
    return table


@dataclass
class DeduplicateReplay:
    """The expected table of the deduplicate pipeline and how many keys had two live claims at the end."""

    table: dict[int, dict]
    contested: int
    closest_gap_ms: int | None


def replay_deduplicate(sources: list[list[Record]], ignore: set[int]) -> DeduplicateReplay:
    """Per primary key the live claim whose last change is the latest (Kafka timestamp, then position)."""
    claims: dict[int, dict[str, tuple[tuple, dict]]] = {}
    for records in sources:
        for record, key, op, after in _changes(records):
            if key in ignore:
                continue
            live = claims.setdefault(key, {})
            if op == "d":
                live.pop(record.topic, None)
            else:
                live[record.topic] = ((record.timestamp, record.topic, record.partition, record.offset), after)
    table, contested, gaps = {}, 0, []
    for key, live in claims.items():
        if not live:
            continue
        ordered = sorted(live.values(), key=lambda claim: claim[0])
        table[key] = ordered[-1][1]
        if len(ordered) > 1:
            contested += 1
            gaps.append(ordered[-1][0][0] - ordered[-2][0][0])
    return DeduplicateReplay(table, contested, min(gaps) if gaps else None)


def compare_table(uri: str, expected: dict[int, dict], ignore: AbstractSet[int] = frozenset()) -> Comparison:
    """The Delta table (read with deltalake) against `expected`, by primary key `id`."""
    rows = [r for r in pa.table(DeltaTable(uri).to_pyarrow_table()).to_pylist() if r["id"] not in ignore]
    result = Comparison(expected=len(expected), found=len(rows))
    counts = Counter(r["id"] for r in rows)
    for key, count in sorted(counts.items()):
        if count > 1:
            result.duplicated += count - 1
            result.note(f"id {key}: {count} rows")
    found = {r["id"]: r for r in rows}
    for key in sorted(expected.keys() - found.keys()):
        result.lost += 1
        result.note(f"id {key}: missing")
    for key in sorted(found.keys() - expected.keys()):
        result.extra += 1
        result.note(f"id {key}: not in the replay")
    for key in sorted(expected.keys() & found.keys()):
        if found[key] != expected[key]:
            result.wrong += 1
            result.note(f"id {key}: row differs from the replay")
    return result


def feed_changes(uri: str) -> dict[tuple[int, int], tuple[str, dict]]:
    """The table's change feed as {(commit version, id): (Debezium op, row)}; update pre-images dropped."""
    feed = pa.table(DeltaTable(uri).load_cdf(starting_version=0)).to_pylist()
    changes = {}
    for row in feed:
        op = FEED_OPS.get(row["_change_type"])
        if op is not None:
            image = {k: v for k, v in row.items() if not k.startswith("_")}
            changes[(row["_commit_version"], row["id"])] = (op, image)
    return changes


def compare_export(uri: str, records: list[Record]) -> Comparison:
    """Every feed change published once (op and row image equal), nothing else published."""
    expected = feed_changes(uri)
    seen: Counter = Counter()
    result = Comparison(expected=len(expected), found=len(records))
    for record in records:
        if record.value is None:
            result.extra += 1
            result.note(f"partition {record.partition}, offset {record.offset}: a tombstone (tombstones are off)")
            continue
        envelope = json.loads(record.value)
        image = envelope["after"] or envelope["before"]
        coordinates = (envelope["source"]["version"], image["id"])
        seen[coordinates] += 1
        want = expected.get(coordinates)
        if want is None:
            result.extra += 1
            result.note(f"version {coordinates[0]}, id {coordinates[1]}: not in the change feed")
        elif seen[coordinates] == 1 and (want[0] != envelope["op"] or (want[0] != "d" and want[1] != image)):
            result.wrong += 1
            result.note(f"version {coordinates[0]}, id {coordinates[1]}: op or row differs from the feed")
    for coordinates, count in seen.items():
        if count > 1 and coordinates in expected:
            result.duplicated += count - 1
            result.note(f"version {coordinates[0]}, id {coordinates[1]}: published {count} times")
    for coordinates in sorted(expected.keys() - seen.keys()):
        result.lost += 1
        result.note(f"version {coordinates[0]}, id {coordinates[1]}: never published")
    return result
