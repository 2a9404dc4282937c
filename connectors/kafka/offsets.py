"""Source offsets: the next offset to read per topic partition, and admission control.

An offset map is `{topic: {partition (as text): next offset}}`: plain JSON, so Spark keeps
it in the checkpoint's offset log. Pure functions, no Kafka client here.
"""

from __future__ import annotations

from typing import Mapping

OffsetMap = dict[str, dict[str, int]]
RESERVED_PREFIX = "$"
"""Keys of an offset map starting with this are not topics (Kafka topic names cannot hold '$')."""
PIECES_KEY = "$pieces"
"""The offset's entry recording how its ranges are cut (`pieces_entry`), so a replay cuts them alike."""


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


def cap_rows_by_topic(
    start: Mapping[tuple[str, int], int],
    available: Mapping[tuple[str, int], int],
    max_rows: int | None,
) -> dict[tuple[str, int], int]:
    """End offsets that admit at most `max_rows` records, touching as few topics as they can.

    For a source of many topics each written on its own (one Delta table per topic), where each
    topic a micro-batch touches costs a commit: whole topics are admitted, smallest backlog first,
    so a backlog slightly over the limit does not spread a second batch over every topic. The topic
    with the largest backlog is served first with up to a quarter of the limit (it always makes
    progress), the next topic that does not fit whole gets what is left (`cap_rows` over its
    partitions). Deterministic for the same offsets.
    """
    backlog = {tp: max(0, end - start.get(tp, end)) for tp, end in available.items()}
    if max_rows is None or sum(backlog.values()) <= max_rows:
        return dict(available)
    topics: dict[str, int] = {}
    for (topic, _), lag in backlog.items():
        topics[topic] = topics.get(topic, 0) + lag
    admitted: dict[str, int] = {}
    largest = max(sorted(topics), key=lambda t: topics[t])
    admitted[largest] = min(topics[largest], max(1, max_rows // 4))
    budget = max_rows - admitted[largest]
    for topic in sorted((t for t in topics if t != largest and topics[t]), key=lambda t: (topics[t], t)):
        take = min(topics[topic], budget)
        if take <= 0:
            break
        admitted[topic] = take
        budget -= take
    if budget > 0:
        admitted[largest] = min(topics[largest], admitted[largest] + budget)
    end = {tp: start.get(tp, available[tp]) for tp in available}
    for topic, rows in admitted.items():
        parts = {tp: available[tp] for tp in available if tp[0] == topic}
        end.update(cap_rows(start, parts, rows) if rows < topics[topic] else parts)
    return end


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


def pieces_entry(min_pieces: int, min_rows: int) -> dict[str, dict[str, int]]:
    """The offset entry of a plan that cuts ranges (`split_spans`); none when nothing is cut."""
    if min_pieces <= 1:
        return {}
    return {PIECES_KEY: {"min_pieces": int(min_pieces), "min_rows": int(min_rows)}}


def planned_pieces(end: Mapping[str, object]) -> tuple[int, int]:
    """(min_pieces, min_rows) as the end offset recorded them; (0, 0), no cut, when it records none
    (an offset planned before ranges were cut, or by a reader that does not cut)."""
    entry = end.get(PIECES_KEY)
    if not isinstance(entry, Mapping):
        return 0, 0
    return int(entry.get("min_pieces", 0)), int(entry.get("min_rows", 0))
