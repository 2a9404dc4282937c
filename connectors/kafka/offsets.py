"""Source offsets: the next offset to read per topic partition, and admission control.

An offset map is `{topic: {partition (as text): next offset}}`: plain JSON, so Spark keeps
it in the checkpoint's offset log. Pure functions, no Kafka client here.
"""

from __future__ import annotations

from typing import Mapping

OffsetMap = dict[str, dict[str, int]]
RESERVED_PREFIX = "$"
"""Keys of an offset map starting with this are not topics (Kafka topic names cannot hold '$')."""


def to_map(positions: Mapping[tuple[str, int], int]) -> OffsetMap:
    """`{(topic, partition): offset}` -> the JSON-friendly offset map."""
    result: OffsetMap = {}
    for (topic, partition), offset in sorted(positions.items()):
        result.setdefault(topic, {})[str(partition)] = int(offset)
    return result


def from_map(offsets: Mapping[str, Mapping[str, int]]) -> dict[tuple[str, int], int]:
    """The offset map -> `{(topic, partition): offset}` (reserved keys left out)."""
    return {
        (topic, int(partition)): int(offset)
        for topic, parts in offsets.items()
        if not topic.startswith(RESERVED_PREFIX)
        for partition, offset in parts.items()
    }


def cap_rows(
    start: Mapping[tuple[str, int], int],
    available: Mapping[tuple[str, int], int],
    max_rows: int | None,
) -> dict[tuple[str, int], int]:
    """End offsets that admit at most `max_rows` records in total.

    Each partition gets a share proportional to its backlog (as Spark's Kafka source
    does), rounded down, and the remainder goes to the largest backlogs so a trigger
    always makes progress when there is data.
    """
    backlog = {tp: max(0, end - start.get(tp, end)) for tp, end in available.items()}
    total = sum(backlog.values())
    if max_rows is None or total <= max_rows:
        return dict(available)
    shares = {tp: (lag * max_rows) // total for tp, lag in backlog.items()}
    remainder = max_rows - sum(shares.values())
    for tp in sorted(backlog, key=lambda tp: (-backlog[tp], tp)):
        if remainder <= 0:
            break
        if shares[tp] < backlog[tp]:
            shares[tp] += 1
            remainder -= 1
    return {tp: start.get(tp, available[tp]) + shares[tp] for tp in available}


Span = tuple[tuple[str, int], int, int]
"""One partition's offsets to read: `((topic, partition), first, stop)`, stop exclusive."""


def split_spans(spans: list[Span], min_pieces: int, min_rows: int) -> list[Span]:
    """`spans`, the largest cut in two until there are `min_pieces` or no piece could keep
    `min_rows` records; in partition then offset order, so a replay plans the very same pieces.

    For readers that apply a partition's changes in offset order wherever they were read: the
    pieces of one partition are read in parallel (Spark's `minPartitions` of its Kafka source).
    """
    pieces = list(spans)
    while len(pieces) < min_pieces:
        widest = max(range(len(pieces)), key=lambda i: (pieces[i][2] - pieces[i][1], -i), default=None)
        if widest is None:
            break
        tp, first, stop = pieces[widest]
        if stop - first < 2 * min_rows:
            break
        middle = first + (stop - first) // 2
        pieces[widest:widest + 1] = [(tp, first, middle), (tp, middle, stop)]
    return pieces
