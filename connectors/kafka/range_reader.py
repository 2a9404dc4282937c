"""Read one partition's offset range [start, end) into Arrow record batches (executor side)."""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Iterator, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from connectors.kafka.cluster import client_config
from connectors.kafka.errors import KafkaUnavailable

RAW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)
_MAX_BINARY_BYTES = 2**31 - 1
FLOOR_COLUMN = "watermark_floor"
"""Least event-time progress (epoch ms) of the other active partitions when the range was planned;
null when no other partition holds the watermark (see `connectors.kafka.watermarks`)."""
SOURCE_SCHEMA = RAW_SCHEMA.append(pa.field(FLOOR_COLUMN, pa.int64()))
RAW_SPARK_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset bigint, "
    f"timestamp timestamp, headers array<struct<key:string,value:binary>>, {FLOOR_COLUMN} bigint"
)
BATCH_ROWS = 5_000
"""Records per chunk a range is read in (and decoded in)."""
US_PER_MS = 1_000
_MAX_RESPONSE_BYTES = 1 << 30
_QUEUED_KIB = 8 * 1024
FETCH_QUEUE_BACKOFF_MS = 10
"""How long librdkafka waits to fetch again once a partition's prefetch queue is full (its default, 1,000)."""
FETCH_WAIT_MAX_MS = 10
"""How long the broker may hold a reader's fetch for records not yet written (librdkafka's default, 500)."""
_POLL_TIMEOUT_S = 1.0
_STALL_TIMEOUT_S = 120.0
_IDLE_PER_CONFIG = 4  # idle consumers kept per configuration: a task's reads run one after another


@dataclass
class ValueChunk:
    """Values of consecutive records of one partition, with their offsets and timestamps (epoch
    ms, None when the record has none), as Python lists: for a decoder that needs nothing else."""

    topic: str
    partition: int
    values: list[bytes | None] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    timestamps: list[int | None] = field(default_factory=list)
    first_key: bytes | None = None
    """The first Kafka key of the chunk that is not null."""
    partitions: list[int] | None = None
    """Per record, its partition, when the chunk joins ranges of several partitions of its topic
    (`joined_chunk`); None: every record is of `partition`."""
    messages: list | None = None
    """With `read_values(keep_records=True)`: the records as read, for `records` (their keys and headers
    are only turned into Python objects for the records a decoder asks for)."""
    floor: int | None = None
    """The range's watermark floor (`read_range`), with `messages`."""

    def records(self, positions: Iterable[int] | None = None) -> pa.RecordBatch:
        """The records at `positions` of the chunk (all: None) as `read_range` gives them (`SOURCE_SCHEMA`);
        only for a chunk read with `keep_records`."""
        if self.messages is None:
            raise ValueError("a chunk read without keep_records holds no records")
        columns = _Columns(self.topic, self.partition)
        for position in range(len(self.messages)) if positions is None else positions:
            columns.add(self.messages[position], self.offsets[position])
        batch = columns.flush()
        floors = pa.array([self.floor] * batch.num_rows, pa.int64())
        return pa.RecordBatch.from_arrays([*batch.columns, floors], schema=SOURCE_SCHEMA)

    @classmethod
    def of_batch(cls, batch: pa.RecordBatch) -> "ValueChunk":
        """The chunk of a batch in `RAW_SCHEMA` (one topic partition)."""
        millis = pc.divide(pc.cast(batch.column("timestamp"), pa.int64()), US_PER_MS)
        topic, partition = (batch.column(c)[0].as_py() if batch.num_rows else None for c in ("topic", "partition"))
        keys = batch.column("key").drop_null()
        return cls(cast(str, topic), cast(int, partition), batch.column("value").to_pylist(), batch.column("offset").to_pylist(),
                   millis.to_pylist(), keys[0].as_py() if len(keys) else None)


def joined_chunk(chunks: list[ValueChunk]) -> ValueChunk:
    """One chunk of the records of `chunks` (one topic; chunks of different partitions, each partition's
    in offset order), in the order given, each record with its partition: what a decoder pays per
    chunk is then paid once for them all. `partition` is the first chunk's, `first_key` the first one
    that is not null."""
    if not chunks:
        raise ValueError("no chunk to join")
    topics = {chunk.topic for chunk in chunks}
    if len(topics) > 1:
        raise ValueError(f"chunks of several topics cannot be joined: {sorted(topics)}")
    joined = ValueChunk(chunks[0].topic, chunks[0].partition, partitions=[],
                        first_key=next((c.first_key for c in chunks if c.first_key is not None), None))
    for chunk in chunks:
        joined.values.extend(chunk.values)
        joined.offsets.extend(chunk.offsets)
        joined.timestamps.extend(chunk.timestamps)
        assert joined.partitions is not None
        joined.partitions.extend(chunk.partitions if chunk.partitions is not None else [chunk.partition] * len(chunk.offsets))
    return joined


class _Values:
    """Buffers of one `ValueChunk` (keys and headers are not read); `keep_records`: the messages kept too."""

    def __init__(self, topic: str, partition: int, keep_records: bool = False, floor: int | None = None) -> None:
        self.topic, self.partition, self.keep_records, self.floor = topic, partition, keep_records, floor
        self.chunk = self._new()

    def _new(self) -> ValueChunk:
        return ValueChunk(self.topic, self.partition, messages=[] if self.keep_records else None, floor=self.floor)

    def add(self, message, offset: int) -> None:
        if self.chunk.first_key is None:
            self.chunk.first_key = message.key()
        if self.chunk.messages is not None:
            self.chunk.messages.append(message)
        self.chunk.values.append(message.value())
        self.chunk.offsets.append(offset)
        ts_ms = message.timestamp()[1]
        self.chunk.timestamps.append(ts_ms if ts_ms is not None and ts_ms >= 0 else None)

    def add_all(self, messages: list) -> None:
        """Records read together, none an error, all inside the range: as `add` does one by one, with the
        messages' own methods mapped over them (one Python step per record left: the timestamp's check)."""
        chunk = self.chunk
        if chunk.first_key is None:
            chunk.first_key = next((key for key in map(Message.key, messages) if key is not None), None)
        if chunk.messages is not None:
            chunk.messages.extend(messages)
        chunk.values.extend(map(Message.value, messages))
        chunk.offsets.extend(cast("Iterable[int]", map(Message.offset, messages)))
        chunk.timestamps.extend(ts if ts is not None and ts >= 0 else None
                                for _, ts in map(Message.timestamp, messages))

    def __len__(self) -> int:
        return len(self.chunk.offsets)

    def flush(self) -> ValueChunk:
        chunk, self.chunk = self.chunk, self._new()
        return chunk


class _Columns:
    """Column buffers for one Arrow batch of one partition (topic and partition are the range's)."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition
        self._clear()

    def _clear(self) -> None:
        self.keys: list = []
        self.values: list = []
        self.offsets: list[int] = []
        self.timestamps: list = []
        self.headers: list = []

    def add(self, message, offset: int) -> None:
        """One record (`offset` is the message's, already read by the caller)."""
        self.keys.append(message.key())
        self.values.append(message.value())
        self.offsets.append(offset)
        ts_ms = message.timestamp()[1]
        self.timestamps.append(ts_ms * 1000 if ts_ms is not None and ts_ms >= 0 else None)
        headers = message.headers()
        self.headers.append([{"key": k, "value": v} for k, v in headers] if headers else None)

    def add_all(self, messages: list) -> None:
        """Records read together, none an error, all inside the range."""
        for message in messages:
            self.add(message, message.offset())

    def __len__(self) -> int:
        return len(self.offsets)

    def flush(self) -> pa.RecordBatch:
        rows = len(self.offsets)
        arrays = [
            pa.array(self.keys, pa.binary()), binary_array(self.values),
            pa.array([self.topic] * rows, pa.string()),
            pa.array([self.partition] * rows, pa.int32()), pa.array(self.offsets, pa.int64()),
            pa.array(self.timestamps, RAW_SCHEMA.field("timestamp").type),
            pa.array(self.headers, RAW_SCHEMA.field("headers").type),
        ]
        self._clear()
        return pa.RecordBatch.from_arrays(arrays, schema=RAW_SCHEMA)


def binary_array(items: list[bytes | None]) -> pa.Array:
    """`pa.array(items, pa.binary())`, built from one join of the bytes: with the C library's
    allocator (`service/runtime/allocators.py`) `pa.array` grows its data buffer by reallocation,
    which costs three times as much for a batch of large values."""
    lengths = np.fromiter((0 if item is None else len(item) for item in items), np.int64, len(items))
    if int(lengths.sum()) > _MAX_BINARY_BYTES:
        return pa.array(items, pa.binary())  # beyond 32-bit offsets: Arrow says so
    offsets = np.zeros(len(items) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    validity = None
    if any(item is None for item in items):  # tombstones
        validity = pa.array([item is not None for item in items], pa.bool_()).buffers()[1]
    data = b"".join(item for item in items if item is not None)
    return pa.Array.from_buffers(pa.binary(), len(items), [validity, pa.py_buffer(offsets), pa.py_buffer(data)])


def read_range(
    options: dict[str, str], topic: str, partition: int, start: int, end: int, floor: int | None = None
) -> Iterator[pa.RecordBatch]:
    """Yield the records with start <= offset < end, in offset order (`SOURCE_SCHEMA`; every row
    carries the range's watermark `floor`).

    Offsets may have gaps (compaction, transaction markers, aborted records), so the
    range is done when the consumer's position reaches `end`, not when `end - 1` is seen.
    """
    for batch in _read(options, topic, partition, start, end, _Columns(topic, partition)):
        floors = pa.array([floor] * batch.num_rows, pa.int64())
        yield pa.RecordBatch.from_arrays([*batch.columns, floors], schema=SOURCE_SCHEMA)


def read_values(options: dict[str, str], topic: str, partition: int, start: int, end: int,
                keep_records: bool = False, floor: int | None = None) -> Iterator[ValueChunk]:
    """Yield the values of the records with start <= offset < end, in offset order, as
    `ValueChunk`s: a quarter of the reading work of `read_range` per record on Debezium's records, whose
    context headers cost most of it (`docs/design/ingest-data-path.md`). `keep_records`: each chunk also
    keeps its records, for `ValueChunk.records` (with the range's watermark `floor`)."""
    yield from _read(options, topic, partition, start, end, _Values(topic, partition, keep_records, floor))


def read_values_of_ranges(options: dict[str, str], ranges: list[tuple[str, int, int, int]]
                          ) -> dict[tuple[str, int, int, int], list[ValueChunk]]:
    """The values of many ranges (topic, partition, start, end) of different partitions, read by one
    consumer assigned to all of them at once: per range, its `ValueChunk`s (as `read_values` yields
    them). For many small ranges: a consumer per range costs about as much as reading a few hundred
    records, and one fetch request serves every partition of the broker. Ranges of one partition
    are read in turn (one assignment holds a partition once)."""
    found: dict[tuple[str, int, int, int], list[ValueChunk]] = {tuple(r): [] for r in ranges}  # type: ignore[misc]
    waves: list[list[tuple[str, int, int, int]]] = []
    for kafka_range in sorted(found, key=lambda r: (r[0], r[1], r[2])):
        wave = next((w for w in waves if all(r[:2] != kafka_range[:2] for r in w)), None)
        if wave is None:
            waves.append(wave := [])
        wave.append(kafka_range)
    for wave in waves:
        todo = [r for r in wave if r[3] > r[2]]
        if not todo:
            continue
        with _reader(options) as consumer:
            _consume_many(consumer, todo, found)
    return found


def _consume_many(consumer: Consumer, ranges: list[tuple[str, int, int, int]],
                  found: dict[tuple[str, int, int, int], list[ValueChunk]]) -> None:
    """Read every range (one per partition) in one pass; a partition is paused when its range is done."""
    by_partition = {(topic, partition): (topic, partition, start, end) for topic, partition, start, end in ranges}
    buffers = {tp: _Values(*tp) for tp in by_partition}
    positions = {tp: r[2] for tp, r in by_partition.items()}
    open_ = set(by_partition)
    consumer.assign([TopicPartition(topic, partition, start) for topic, partition, start, _ in ranges])

    def finish(tp: tuple[str, int]) -> None:
        open_.discard(tp)
        consumer.pause([TopicPartition(*tp)])
        if len(buffers[tp]):
            found[by_partition[tp]].append(buffers[tp].flush())

    last_progress = time.monotonic()
    while open_:
        # No more than the ranges still hold: consume() waits until it has that many (or times out).
        wanted = max(1, min(BATCH_ROWS, sum(by_partition[tp][3] - positions[tp] for tp in open_)))
        messages = consumer.consume(num_messages=wanted, timeout=_POLL_TIMEOUT_S)
        for message in messages:
            tp = (message.topic(), message.partition())
            if tp not in open_:
                continue
            end = by_partition[tp][3]
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    positions[tp] = max(positions[tp], message.offset())
                    if positions[tp] >= end:
                        finish(tp)
                    continue
                raise KafkaUnavailable(f"reading topic={tp[0]} partition={tp[1]}: {error}")
            offset = cast(int, message.offset())
            if offset >= end:
                finish(tp)
                continue
            buffers[tp].add(message, offset)
            positions[tp] = offset + 1
            if positions[tp] >= end:
                finish(tp)
            elif len(buffers[tp]) >= BATCH_ROWS:
                found[by_partition[tp]].append(buffers[tp].flush())
        if messages:
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > _STALL_TIMEOUT_S:
            waiting = ", ".join(f"topic={t} partition={p} at offset {positions[(t, p)]} (range ends at "
                                f"{by_partition[(t, p)][3]})" for t, p in sorted(open_))
            raise KafkaUnavailable(f"no progress reading {waiting}")
        if open_ and not messages:  # transaction markers move the position past the last record
            for current in consumer.position([TopicPartition(*tp) for tp in sorted(open_)]):
                tp = (current.topic, current.partition)
                if current.offset >= 0:
                    positions[tp] = max(positions[tp], current.offset)
                if positions[tp] >= by_partition[tp][3]:
                    finish(tp)
    # A partition stays paused through a new assignment: the consumer's next read would wait forever.
    consumer.resume([TopicPartition(*tp) for tp in by_partition])


def _reader_config(options: dict[str, str]) -> dict[str, str]:
    config = client_config(options, "reader")
    config["enable.partition.eof"] = "true"
    # A broker that ignores the fetch size limits (the embedded one answers with 138 MB at a time when
    # a range holds a few hundred thousand records) must not stall the read; Kafka honours them anyway.
    config.setdefault("receive.message.max.bytes", str(_MAX_RESPONSE_BYTES))
    # A range ends where it ends: librdkafka's default prefetch queue (64 MiB per partition) only fetches
    # records past the range's end for the broker to send and this process to drop. 300,000 envelopes on
    # the embedded broker, `run --until-idle` (one run each): wall 9.9-11.5 -> 7.7 s, a steady batch of
    # 100,000 records read+decode+reduce 1.04-1.09 -> 0.53 s; 2 MiB, 8 MiB and 32 MiB gave 0.63, 0.53 and
    # 0.98 s. A setting in the pipeline's Kafka options wins.
    config.setdefault("queued.max.messages.kbytes", str(_QUEUED_KIB))
    # A reader decodes between its reads, so the prefetch queue fills up; librdkafka then puts the
    # partition's next fetch off by `fetch.queue.backoff.ms`, and the reader, done with the queue,
    # waits for it. With the default (1 s) a steady batch of 100,000 records on Apache Kafka spent 74 %
    # of its task time waiting in `consume()`: read+decode+reduce 2.6-2.7 s, with 10 ms 0.9 s
    # (docs/design/ingest-data-path.md). A setting in the pipeline's Kafka options wins.
    config.setdefault("fetch.queue.backoff.ms", str(FETCH_QUEUE_BACKOFF_MS))
    # A range ends at or below the high watermark it was planned at, so the broker holds its records: the only
    # fetch that waits for new ones is the prefetch past the range's end once it reaches the log end, which
    # the broker then holds for `fetch.wait.max.ms`. The consumer's next fetch goes out when that one returns,
    # so a kept consumer (`IDLE_CONSUMERS`) reading its next range waited for it: on the capture's topic of
    # four partitions, the second range of each task spent 0.58-0.61 s in `consume()` against 0.21-0.26 s
    # (docs/design/ingest-data-path.md, "A fetch held at the log end"). A setting in the pipeline's Kafka
    # options wins.
    config.setdefault("fetch.wait.max.ms", str(FETCH_WAIT_MAX_MS))
    # Only a partition first seen after the query started is planned below its low watermark.
    config["auto.offset.reset"] = "earliest"
    return config


class _IdleConsumers:
    """This process's connected consumers between reads, per reader configuration.

    Opening a consumer (the bootstrap connection, metadata, then the partition leader's connection)
    took 50-130 ms before its first record, where a connected one read a range of 5,000 records in
    15-27 ms (docs/design/ingest-data-path.md, "Connected consumers kept between ranges"). A Python
    worker runs one task after another, each reading its ranges, so the next range reuses the last
    one's consumer. A consumer goes back only after a read that ended without an error, and
    unassigned: it fetches nothing while idle, and its next `assign` starts from the range's start."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[tuple[tuple[str, str], ...], list[Consumer]] = {}

    def take(self, config: dict[str, str]) -> Consumer:
        with self._lock:
            idle = self._idle.get(tuple(sorted(config.items())))
            if idle:
                return idle.pop()
        return Consumer(config)

    def give_back(self, config: dict[str, str], consumer: Consumer) -> None:
        consumer.unassign()
        with self._lock:
            idle = self._idle.setdefault(tuple(sorted(config.items())), [])
            if len(idle) < _IDLE_PER_CONFIG:
                idle.append(consumer)
                return
        consumer.close()

    def close(self) -> None:
        with self._lock:
            consumers = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for consumer in consumers:
            consumer.close()

    def forget(self) -> None:
        """In a forked child: the parent's consumers are not the child's (their threads stayed behind).

        They are never destroyed here either: librdkafka's destroy works through those threads, and
        in the child it aborted the process (an assertion on the consumer group's partitions, seen when
        the fork came while the parent's last unassign was still under way). Each keeps one reference
        that nothing drops, so not even the interpreter's shutdown deallocates it."""
        for idle in self._idle.values():
            for consumer in idle:
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(consumer))
        self._lock = threading.Lock()
        self._idle = {}


IDLE_CONSUMERS = _IdleConsumers()
atexit.register(IDLE_CONSUMERS.close)
os.register_at_fork(after_in_child=IDLE_CONSUMERS.forget)


@contextmanager
def _reader(options: dict[str, str]) -> Iterator[Consumer]:
    """A reader's consumer for one read: an idle one of this process where there is one (`_IdleConsumers`)."""
    config = _reader_config(options)
    consumer = IDLE_CONSUMERS.take(config)
    try:
        yield consumer
    except BaseException:  # a failed or abandoned read: its consumer is not used again
        consumer.close()
        raise
    IDLE_CONSUMERS.give_back(config, consumer)


def _read(options: dict[str, str], topic: str, partition: int, start: int, end: int, columns: _Columns | _Values) -> Iterator:
    tp = TopicPartition(topic, partition, start)
    with _reader(options) as consumer:
        consumer.assign([tp])
        yield from _consume(consumer, tp, end, columns)


def _consume(consumer: Consumer, tp: TopicPartition, end: int, columns: _Columns | _Values) -> Iterator:
    position = tp.offset
    last_progress = time.monotonic()
    while position < end:
        # Ask for no more than the range still holds: consume() waits until it has that many.
        wanted = max(1, min(BATCH_ROWS, end - position))
        messages = consumer.consume(num_messages=wanted, timeout=_POLL_TIMEOUT_S)
        if messages and not any(map(Message.error, messages)) and cast(int, messages[-1].offset()) < end:
            columns.add_all(messages)  # the common case: records only, all of the range
            position = cast(int, messages[-1].offset()) + 1
            messages = []
            last_progress = time.monotonic()
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    position = max(position, message.offset())
                    continue
                raise KafkaUnavailable(f"reading topic={tp.topic} partition={tp.partition}: {error}")
            offset = cast(int, message.offset())  # set on every record (None only on errors)
            if offset >= end:
                position = end
                break
            columns.add(message, offset)
            position = offset + 1
        if messages:
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > _STALL_TIMEOUT_S:
            raise KafkaUnavailable(
                f"no progress reading topic={tp.topic} partition={tp.partition} "
                f"at offset {position} (range ends at {end})"
            )
        if len(columns) >= BATCH_ROWS:
            yield columns.flush()
        position = max(position, _committed_position(consumer, tp))
    if len(columns):
        yield columns.flush()


def _committed_position(consumer: Consumer, tp: TopicPartition) -> int:
    try:
        (current,) = consumer.position([TopicPartition(tp.topic, tp.partition)])
    except KafkaException:
        return -1
    return current.offset
