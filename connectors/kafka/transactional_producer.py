"""Exactly-once publishing: a batch of records and its position record in one Kafka transaction.

A `TransactionalProducer` owns one `transactional.id`. `open()` calls `init_transactions`,
which fences any older producer with the same id (a zombie of a crashed process) and aborts
its open transaction, so afterwards this instance is the only writer for that id.

`send_batch(records, position, state)` publishes the records to the output topic, the
position record to the positions topic and the state records (if any) to the state topic in
ONE transaction: a read_committed consumer sees all of them or none. `last_committed_position(key)`
reads the positions topic back and `committed_state()` the state topic (read_committed, to the
log end, the last value per key, a null value deleting the key); call them after `open()` so no
transaction of our own id is still pending. Both topics are compacted. The read goes to the log
end, not to the last stable offset: the positions topic is shared by every export (and every
dead-letter writer), and another writer's open transaction holds the stable offset below
positions committed after it began; a reader stopping there would take an older position for
the last one and publish a batch again. So the read waits for such a transaction to be decided
(raising `KafkaUnavailable` when it makes no progress for the timeout).

Errors: fatal librdkafka errors (fenced by a newer instance, authorization) raise
`TransactionFatal` (terminal); abortable and retriable ones abort the transaction and raise
`TransactionAborted` (transient). After any error the producer must be closed and a new one
opened: the outcome of a commit that timed out is only known by reading the position back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from connectors.kafka.cluster import ClusterView, client_config
from connectors.kafka.errors import KafkaUnavailable
from vocabulary.errors import TerminalError, TransientError

KafkaRecord = tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None]
StateRecord = tuple[bytes, bytes | None]  # (key, value); a None value deletes the key
COMPACTED = {"cleanup.policy": "compact"}
DEFAULT_TIMEOUT_S = 60.0
_POLL_S = 0.5
# `Producer.produce`'s positional arguments after the key: partition, callback, on_delivery, timestamp, headers.
_ANY_PARTITION = -1  # the configured partitioner picks
_NOW = 0  # the producer stamps the record
_READ_BATCH = 10_000
_BROKER_DEFAULT_REPLICATION = -1


class TransactionAborted(TransientError):
    """A transaction was aborted (or its outcome is unknown); publishing it again may succeed."""


class TransactionFatal(TerminalError):
    """The producer cannot go on: fenced by a newer instance with the same id, or not allowed."""


@dataclass(frozen=True)
class PositionRecord:
    """The record committed next to a batch: `key` names the writer, `value` says how far it got."""

    key: str
    value: bytes


def _error_of(exception: KafkaException) -> KafkaError | None:
    error = exception.args[0] if exception.args else None
    return error if isinstance(error, KafkaError) else None


_FENCED_CODES = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED)
# Not always flagged fatal by librdkafka, but retrying cannot help.
_TERMINAL_CODES = _FENCED_CODES + (
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED,
)


class TransactionalProducer:
    """One transactional producer writing batches to `output_topic`, positions to `positions_topic`."""

    def __init__(
        self,
        config: dict[str, str],
        transactional_id: str,
        output_topic: str,
        positions_topic: str,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        state_topic: str | None = None,
    ) -> None:
        self.config = dict(config)
        self.transactional_id = transactional_id
        self.output_topic = output_topic
        self.positions_topic = positions_topic
        self.state_topic = state_topic
        self.timeout_s = timeout_s
        self._producer: Producer | None = None

    def _where(self) -> str:
        return f"transactional.id={self.transactional_id} topic={self.output_topic}"

    def _wrap(self, exception: KafkaException, action: str) -> Exception:
        error = _error_of(exception)
        reason = error.str() if error is not None else str(exception)
        if error is not None and (error.fatal() or error.code() in _TERMINAL_CODES):
            fenced = error.code() in _FENCED_CODES
            hint = " (a newer instance with the same transactional.id took over)" if fenced else ""
            return TransactionFatal(f"{self._where()}: {action} failed: {reason}{hint}")
        return TransactionAborted(f"{self._where()}: {action} failed: {reason}")

    def open(self) -> None:
        """Register the transactional id (fencing older instances); make sure positions and state topics exist."""
        if self._producer is not None:
            return
        for topic in filter(None, (self.positions_topic, self.state_topic)):
            ensure_compacted_topic(self.config, topic, self.timeout_s)
        producer = Producer({
            **self.config,
            "transactional.id": self.transactional_id,
            "enable.idempotence": True,
            "acks": "all",
        })
        try:
            producer.init_transactions(self.timeout_s)
        except KafkaException as exception:
            raise self._wrap(exception, "init_transactions") from None
        self._producer = producer

    def send_batch(
        self, records: Iterable[KafkaRecord], position: PositionRecord, state: Iterable[StateRecord] = (),
    ) -> None:
        """Publish `records`, `state` and `position` atomically; on any error abort the transaction and raise."""
        self.open()
        producer = self._producer
        try:
            producer.begin_transaction()
            produce, topic = producer.produce, self.output_topic
            for key, value, headers in records:
                try:  # positional: librdkafka's binding parses them in about half the time of keywords
                    produce(topic, value, key, _ANY_PARTITION, None, None, _NOW, headers or None)
                except BufferError:
                    self._produce(topic, key, value, headers or None)
            for key, value in state:
                self._produce(self._state_topic(), key, value, None)
            self._produce(self.positions_topic, position.key.encode(), position.value, None)
            producer.commit_transaction(self.timeout_s)
        except KafkaException as exception:
            wrapped = self._wrap(exception, "publishing a batch")
            self._abort_quietly()
            raise wrapped from None
        except BaseException:
            self._abort_quietly()
            raise

    def _produce(self, topic: str, key: bytes | None, value: bytes | None, headers) -> None:
        while True:
            try:
                self._producer.produce(topic, value, key, _ANY_PARTITION, None, None, _NOW, headers)
                return
            except BufferError:
                # The local queue is full: let librdkafka send some before queueing more.
                self._producer.poll(_POLL_S)

    def _abort_quietly(self) -> None:
        try:
            self._producer.abort_transaction(self.timeout_s)
        except KafkaException:
            pass  # fatal or unknown state: the next open() fences and aborts it anyway

    def _state_topic(self) -> str:
        if self.state_topic is None:
            raise ValueError(f"{self._where()}: state records given, but no state topic configured")
        return self.state_topic

    def last_committed_position(self, key: str, stable_only: bool = False) -> bytes | None:
        """The value of the last committed position record for `key`, or None if there is none.

        `stable_only`: read to the last stable offset and never wait for another writer's open
        transaction; the answer may be an older position. For readers that only look (status, the
        retention check), where an older position is the safe side; never for a writer resuming."""
        return self._committed(self.positions_topic, "positions", stable_only).get(key.encode())

    def committed_state(self) -> dict[bytes, bytes]:
        """The live committed records of the state topic: the last value per key, deleted keys left out."""
        return self._committed(self._state_topic(), "state")

    def _committed(self, topic: str, purpose: str, stable_only: bool = False) -> dict[bytes, bytes]:
        ensure_compacted_topic(self.config, topic, self.timeout_s)
        # Only committed records count, whatever the configured options say.
        committed_only = {"isolation.level": "read_committed", "enable.partition.eof": "true"}
        view = ClusterView(self.config)
        try:
            partitions = view.partitions([topic])
            if stable_only:
                ends = {p: stable for (_, p), (_, stable) in view.watermarks(partitions).items()}
            else:
                ends = {p: end for (_, p), end in view.log_ends(partitions).items()}
        finally:
            view.close()
        consumer = Consumer({**client_config(self.config, purpose), **committed_only})
        try:
            return _live_values(consumer, topic, ends, self.timeout_s)
        except KafkaException as exception:
            raise KafkaUnavailable(f"topic={topic}: cannot read {purpose}: {exception}") from None
        finally:
            consumer.close()

    def close(self) -> None:
        """Release the producer; a later `open()` starts a fresh one (and fences this one)."""
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.close()


def _live_values(consumer: Consumer, topic: str, ends: dict[int, int], timeout_s: float) -> dict[bytes, bytes]:
    """Read every partition of `topic` to its log end `ends` (read_committed): the last value per key,
    as compaction keeps."""
    pending = {p for p, end in ends.items() if end > 0}
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(pending)])
    live: dict[bytes, bytes] = {}
    deadline = time.monotonic() + timeout_s
    while pending:
        if time.monotonic() > deadline:
            # An open transaction of another writer holds the stable offset below the end.
            raise KafkaUnavailable(f"topic={topic}: not readable to its end (no progress within {timeout_s:.0f}s: "
                                   "a transaction of another writer still open, or the broker away)")
        messages = consumer.consume(_READ_BATCH, _POLL_S)
        for message in messages:
            if message.error() is not None:
                if message.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(message.error())
            elif message.value() is None:
                live.pop(message.key(), None)
            else:
                live[message.key()] = message.value()
        if messages:
            deadline = time.monotonic() + timeout_s
        # The position moves past transaction markers too, so it reaches the end offset.
        positions = consumer.position([TopicPartition(topic, p) for p in pending])
        pending -= {tp.partition for tp in positions if tp.offset >= ends[tp.partition]}
    return live


def ensure_compacted_topic(config: dict[str, str], topic: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Create `topic` (one partition, compacted) unless it exists."""
    admin = AdminClient({**config})
    try:
        if topic in admin.list_topics(timeout=timeout_s).topics:
            return
        futures = admin.create_topics(
            [NewTopic(topic, 1, _BROKER_DEFAULT_REPLICATION, config=COMPACTED)], operation_timeout=timeout_s
        )
        futures[topic].result(timeout_s)
    except KafkaException as exception:
        error = _error_of(exception)
        if error is None or error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise KafkaUnavailable(f"topic={topic}: cannot create it: {exception}") from None
