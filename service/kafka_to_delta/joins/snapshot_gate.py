"""The snapshot gate of an enrichment join: when the build input's snapshot phase is complete.

Pure rule, no Spark and no Kafka client (docs/design/joins-enrichment.md states it in prose).

A Debezium record's `source.snapshot` is a snapshot marker (`SNAPSHOT_VALUES`: `first`,
`true`, ..., `last`) while the connector reads its initial snapshot, then absent, `false` or
`incremental` once it streams. Debezium writes every snapshot record of a partition before the
first streaming record of that partition, and the record marked `last` (or
`last_in_data_collection`, per table) after every other snapshot record of its topic.

A build partition is *complete* when either
  (a) a streaming record has been read on it, or
  (b) a snapshot-end marker (`END_VALUES`) has been read on its topic and the partition has been
      read up to the end offset it had when that marker was first read (`marker_ends`, the
      high watermarks asked of Kafka then; a partition without one counts from offset 0).
A build topic is complete when it has partitions and each is complete. The gate opens at the
end of the first micro-batch after which every build topic is complete, and never closes again.
"How far a partition has been read" is the micro-batch's end offset (the source's offset log),
so transaction markers and compacted gaps at the end of a partition do not hold the gate.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

TopicPartition = tuple[str, int]
SNAPSHOT_VALUES = frozenset({"true", "first", "first_in_data_collection", "last_in_data_collection", "last"})
"""`source.snapshot` values of records of the snapshot phase."""
END_VALUES = frozenset({"last", "last_in_data_collection"})
"""`source.snapshot` values of a topic's last snapshot record."""


def is_snapshot(marker: str | None) -> bool:
    """True for a record of the snapshot phase; absent, `false` and `incremental` are streaming."""
    return marker is not None and marker.lower() in SNAPSHOT_VALUES


def is_snapshot_end(marker: str | None) -> bool:
    """True for the last snapshot record of a topic."""
    return marker is not None and marker.lower() in END_VALUES


@dataclass(frozen=True)
class BuildObservations:
    """What one micro-batch read of the build input.

    `ends`: the batch's end offset per build partition (every partition the source knows, read
    or not); `markers`: the `source.snapshot` value of each decoded build record, with its
    partition (records that failed to decode are left out).
    """

    ends: Mapping[TopicPartition, int]
    markers: Iterable[tuple[TopicPartition, str | None]] = ()


@dataclass(frozen=True)
class GateState:
    """The gate after some batch: open or not, and the progress of each build partition."""

    open: bool = False
    opened_in_batch: int | None = None
    read_to: Mapping[TopicPartition, int] = field(default_factory=dict)  # next offset to read
    streaming: frozenset[TopicPartition] = frozenset()  # partitions past a streaming record
    marker_ends: Mapping[str, Mapping[int, int]] = field(default_factory=dict)  # topic -> partition -> end

    def partition_complete(self, tp: TopicPartition) -> bool:
        """Rule (a) or (b) of the module docstring."""
        if tp in self.streaming:
            return True
        ends = self.marker_ends.get(tp[0])
        return ends is not None and self.read_to.get(tp, 0) >= ends.get(tp[1], 0)

    def topic_complete(self, topic: str) -> bool:
        """Every known partition of the topic complete (a topic with no partition is not)."""
        known = {tp for tp in self.read_to if tp[0] == topic}
        known |= {(topic, p) for p in self.marker_ends.get(topic, {})}
        return bool(known) and all(self.partition_complete(tp) for tp in known)

    def waiting_for(self, topics: Iterable[str]) -> list[str]:
        """The build partitions (as `topic/partition`, or a bare topic with none yet) not complete."""
        waiting = []
        for topic in topics:
            known = sorted({tp for tp in self.read_to if tp[0] == topic} |
                           {(topic, p) for p in self.marker_ends.get(topic, {})})
            if not known:
                waiting.append(topic)
            waiting.extend(f"{t}/{p}" for t, p in known if not self.partition_complete((t, p)))
        return waiting

    def advanced(self, batch_id: int, topics: Iterable[str], seen: BuildObservations,
                 end_offsets: Callable[[str], Mapping[int, int]]) -> "GateState":
        """The state after batch `batch_id` read `seen`; `end_offsets(topic)` gives the topic's
        current end offset per partition (asked only when its first snapshot-end marker is read)."""
        if self.open:
            return self  # no timers, no bookkeeping once open
        read_to = dict(self.read_to)
        for tp, end in seen.ends.items():
            read_to[tp] = max(read_to.get(tp, 0), int(end))
        streaming = set(self.streaming)
        marker_ends = {topic: dict(ends) for topic, ends in self.marker_ends.items()}
        for tp, marker in seen.markers:
            if not is_snapshot(marker):
                streaming.add(tp)
            elif is_snapshot_end(marker) and tp[0] not in marker_ends:
                marker_ends[tp[0]] = {int(p): int(o) for p, o in end_offsets(tp[0]).items()}
        state = replace(self, read_to=read_to, streaming=frozenset(streaming), marker_ends=marker_ends)
        if all(state.topic_complete(topic) for topic in topics):
            state = replace(state, open=True, opened_in_batch=batch_id)
        return state

    def to_json(self) -> str:
        """The state as JSON text (how it is kept in the checkpoint)."""
        return json.dumps({
            "open": self.open,
            "opened_in_batch": self.opened_in_batch,
            "read_to": [[t, p, o] for (t, p), o in sorted(self.read_to.items())],
            "streaming": sorted([t, p] for t, p in self.streaming),
            "marker_ends": {t: {str(p): o for p, o in sorted(ends.items())}
                            for t, ends in sorted(self.marker_ends.items())},
        }, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "GateState":
        """The state `to_json` wrote."""
        data = json.loads(text)
        return cls(
            open=bool(data["open"]),
            opened_in_batch=data.get("opened_in_batch"),
            read_to={(t, int(p)): int(o) for t, p, o in data.get("read_to", [])},
            streaming=frozenset((t, int(p)) for t, p in data.get("streaming", [])),
            marker_ends={t: {int(p): int(o) for p, o in ends.items()}
                         for t, ends in data.get("marker_ends", {}).items()},
        )
