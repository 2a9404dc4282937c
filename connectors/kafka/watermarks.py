"""Event-time watermarks per input partition, combined as the minimum over active partitions.

The rules follow the way a stream processor combines the watermarks of its input channels
(spec: processing-time-watermarks-snapshot-join.txt, the status watermark valve): each Kafka
partition has its own progress, the largest event time read from it so far; the combined
watermark is the minimum of those over the *active* partitions, so a partition that is read
more slowly than the others (a larger backlog, a smaller share of the admission budget) holds
the watermark back instead of having its changes turn late. A partition with no unread data
for `idle_timeout_ms` is idle and stops holding it back; when it has data again it is active
again, and whatever of it is older than the watermark is late under the pipeline's policy.

Where the parts run:
- The source plans each micro-batch on the driver. It keeps `Progress` (largest event time and
  idle-since time per partition) inside its offset, so Spark's offset log checkpoints it and a
  restart resumes from exactly the recorded state. It learns the event times of the records it
  handed out from the `ProgressFile` the pipeline writes after each batch (event times live in
  the decoded payload, which only the pipeline sees).
- Each input range gets the floor of the *other* partitions that hold the watermark (`holding`,
  `floors`), recorded with the batch's offsets so a replay uses the same. Where the records
  are decoded, a row's watermark candidate is min(largest event time read so far in its own
  partition, that floor); Spark's watermark is the maximum of the candidates minus the delay.
  A candidate never exceeds the true combined watermark, because the other partitions' progress
  only grows after planning.

Admission control (`aligned_shares`) reads first from the partitions furthest behind in event
time, so partitions stay aligned and the buffers waiting for the watermark stay small.

Pure functions and plain JSON; no Kafka client, no Spark.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Mapping

from connectors.kafka.offsets import cap_rows

TopicPartition = tuple[str, int]
NO_WATERMARK = 0
"""A floor that holds the watermark back completely (a partition not read yet has no progress)."""
PROGRESS_KEY = "$event_time"
"""Key of the progress inside a source offset (cannot be a Kafka topic name: '$' is not allowed)."""


@dataclass(frozen=True)
class PartitionProgress:
    """One partition: largest event time read (epoch ms; None: nothing read yet) and since when
    (planning time, epoch ms) it has had no unread data (None: it has some)."""

    max_event_ms: int | None = None
    idle_since_ms: int | None = None


@dataclass(frozen=True)
class Progress:
    """The progress of every input partition of one source, as planned at `at_ms` (epoch ms)."""

    partitions: Mapping[TopicPartition, PartitionProgress] = field(default_factory=dict)
    at_ms: int = 0

    def to_json(self) -> dict:
        """`{"at": ms, "partitions": {topic: {partition: [max_event_ms, idle_since_ms]}}}`."""
        out: dict[str, dict[str, list[int | None]]] = {}
        for (topic, partition), item in sorted(self.partitions.items()):
            out.setdefault(topic, {})[str(partition)] = [item.max_event_ms, item.idle_since_ms]
        return {"at": self.at_ms, "partitions": out}

    @classmethod
    def from_json(cls, data: Mapping | None) -> "Progress":
        """The inverse of `to_json` (None: no progress recorded yet)."""
        data = data or {}
        parts = {
            (topic, int(partition)): PartitionProgress(values[0], values[1])
            for topic, by_partition in data.get("partitions", {}).items()
            for partition, values in by_partition.items()
        }
        return cls(parts, int(data.get("at", 0)))

    def advanced(
        self, read_max: Mapping[TopicPartition, int], unread: Mapping[TopicPartition, bool], now_ms: int
    ) -> "Progress":
        """The progress after merging the event times read so far and looking at the backlog.

        `read_max`: largest event time read per partition (from the pipeline's progress file);
        `unread`: per partition, whether it has data not read yet (planned or not).
        """
        out = {}
        for tp in sorted(set(self.partitions) | set(unread)):
            old = self.partitions.get(tp, PartitionProgress())
            reported = read_max.get(tp)
            top = old.max_event_ms if reported is None else max(reported, old.max_event_ms or reported)
            if unread.get(tp, False):
                idle_since = None
            else:
                idle_since = old.idle_since_ms if old.idle_since_ms is not None else now_ms
            out[tp] = PartitionProgress(top, idle_since)
        return Progress(out, now_ms)

    def active(self, idle_timeout_ms: int | None) -> list[TopicPartition]:
        """Partitions that hold the watermark at `at_ms`: not idle for `idle_timeout_ms` (None: never idle)."""
        return [
            tp for tp, item in self.partitions.items()
            if idle_timeout_ms is None or item.idle_since_ms is None or self.at_ms - item.idle_since_ms < idle_timeout_ms
        ]

    def combined(self, idle_timeout_ms: int | None) -> int | None:
        """The combined event time (before the delay): the minimum over active partitions; None when
        every partition is idle; `NO_WATERMARK` while an active partition has no progress."""
        active = self.active(idle_timeout_ms)
        if not active:
            return None
        return min(self.partitions[tp].max_event_ms or NO_WATERMARK for tp in active)

    def holding(self, unread_after: Mapping[TopicPartition, bool], idle_timeout_ms: int | None) -> list:
        """Partitions that hold the watermark the batch being planned produces.

        With a timeout of 0 a partition stops holding it as soon as it is caught up, and the
        watermark this batch produces applies once the batch is read, so what counts is whether
        a partition still has unread data *after* the batch (`unread_after`); when none has,
        nothing holds the watermark back and it follows the largest event time read (as when
        every input channel is idle). Otherwise: `active` at planning time.
        """
        if idle_timeout_ms == 0:
            return sorted(tp for tp in self.partitions if unread_after.get(tp, False))
        return sorted(self.active(idle_timeout_ms))

    def floors(self, ranges: list[TopicPartition], holding: list[TopicPartition]) -> dict:
        """Per partition read in this batch: the least progress of the *other* partitions holding
        the watermark (None: no other partition holds it)."""
        out: dict[TopicPartition, int | None] = {}
        for tp in ranges:
            others = [self.partitions[q].max_event_ms or NO_WATERMARK for q in holding if q != tp]
            out[tp] = min(others) if others else None
        return out

    def floors_json(self, floors: Mapping[TopicPartition, int | None]) -> dict:
        """`to_json()` with the planned floors (what a replay of the batch must use)."""
        planned: dict[str, dict[str, int | None]] = {}
        for (topic, partition), floor in sorted(floors.items()):
            planned.setdefault(topic, {})[str(partition)] = floor
        return {**self.to_json(), "floors": planned}


def planned_floors(data: Mapping | None) -> dict[TopicPartition, int | None]:
    """The floors recorded with a batch's offsets by `Progress.floors_json` (none: empty)."""
    return {
        (topic, int(partition)): floor
        for topic, by_partition in (data or {}).get("floors", {}).items()
        for partition, floor in by_partition.items()
    }


def aligned_shares(
    start: Mapping[TopicPartition, int],
    available: Mapping[TopicPartition, int],
    max_rows: int,
    progress: Progress,
    slack_ms: int,
) -> dict[TopicPartition, int]:
    """End offsets admitting at most `max_rows`, partitions behind in event time first.

    A partition is ahead when its progress exceeds the least progress among partitions with a
    backlog by more than `slack_ms`; the budget goes to the others first (proportional to their
    backlogs), and what they cannot use to the partitions ahead. A partition with no progress
    yet counts as behind. Always admits something when there is a backlog.
    """
    backlog = {tp: end for tp, end in available.items() if end > start.get(tp, end)}
    known = [progress.partitions[tp].max_event_ms for tp in backlog if tp in progress.partitions]
    if any(m is None for m in known) or len(known) < len(backlog) or not backlog:
        floor = NO_WATERMARK
    else:
        floor = min(m for m in known if m is not None)
    ahead = {
        tp for tp in backlog
        if (m := progress.partitions.get(tp, PartitionProgress()).max_event_ms) is not None and m > floor + slack_ms
    }
    behind = {tp: end for tp, end in available.items() if tp not in ahead}
    first = cap_rows(start, behind, max_rows)
    used = sum(first[tp] - start.get(tp, first[tp]) for tp in first)
    rest = {tp: available[tp] for tp in ahead}
    second = cap_rows(start, rest, max_rows - used) if rest and max_rows > used else {
        tp: start.get(tp, available[tp]) for tp in rest
    }
    return {**first, **second}


class ProgressFile:
    """The largest event time the pipeline has read per partition, handed from the pipeline (which
    decodes the records) to the source's planner (which runs in a process of its own).

    Written after each micro-batch, atomically (write then rename); maxima only grow, so a file
    that already covers a batch replayed after a crash is still right for it.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self) -> dict[TopicPartition, int]:
        """The recorded maxima (empty when nothing was written yet)."""
        try:
            with open(self.path, encoding="utf-8") as handle:
                data = json.load(handle)
        except FileNotFoundError:
            return {}
        return {(topic, int(p)): int(ms) for topic, parts in data.items() for p, ms in parts.items()}

    def merge(self, maxima: Mapping[TopicPartition, int]) -> None:
        """Record `maxima`, keeping the larger of old and new per partition."""
        merged = self.read()
        for tp, ms in maxima.items():
            merged[tp] = max(ms, merged.get(tp, ms))
        data: dict[str, dict[str, int]] = {}
        for (topic, partition), ms in sorted(merged.items()):
            data.setdefault(topic, {})[str(partition)] = ms
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        temporary = f"{self.path}.tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(data, handle)
        os.replace(temporary, self.path)
