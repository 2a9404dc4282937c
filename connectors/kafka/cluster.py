"""Partition metadata and watermark offsets through one confluent-kafka admin client."""

from __future__ import annotations

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from connectors.kafka.errors import KafkaUnavailable

_METADATA_TIMEOUT_S = 15.0
TopicPartitionKey = tuple[str, int]
_CONSUMER_ONLY = ("group.id", "enable.auto.commit", "enable.auto.offset.store", "isolation.level",
                  "session.timeout.ms", "auto.offset.reset", "enable.partition.eof")


def client_config(options: dict[str, str], purpose: str) -> dict[str, str]:
    """Consumer configuration for reading by assignment: no group commits, committed data only."""
    config = {
        "group.id": f"cdc-lakehouse-{purpose}",
        "enable.auto.commit": "false",
        "enable.auto.offset.store": "false",
        "isolation.level": "read_committed",
        "session.timeout.ms": "6000",
    }
    config.update(options)
    return config


class ClusterView:
    """Partitions and watermark offsets of a set of topics (driver side).

    Offsets of all partitions are planned with one request per kind (earliest, last stable),
    not one per partition. The high mark is the last stable offset (read_committed): a
    transaction left open on an input partition never holds a micro-batch back waiting for it.
    """

    def __init__(self, options: dict[str, str]) -> None:
        config = {k: v for k, v in options.items() if k not in _CONSUMER_ONLY}
        self._admin = AdminClient(config)

    def topic_names(self) -> list[str]:
        """Every topic the cluster has now."""
        try:
            metadata = self._admin.list_topics(timeout=_METADATA_TIMEOUT_S)
        except KafkaException as error:
            raise KafkaUnavailable(f"cannot list topics: {error.args[0]}") from None
        return sorted(name for name, info in metadata.topics.items() if info.error is None)

    def partitions(self, topics: list[str]) -> list[TopicPartitionKey]:
        """Every partition of the topics that exist now (a missing topic has none yet)."""
        try:
            metadata = self._admin.list_topics(timeout=_METADATA_TIMEOUT_S)
        except KafkaException as error:
            raise KafkaUnavailable(f"cannot list topics: {error.args[0]}") from None
        found = []
        for topic in topics:
            info = metadata.topics.get(topic)
            if info is not None and info.error is None:
                found.extend((topic, p) for p in sorted(info.partitions))
        return found

    def watermarks(self, partitions: list[TopicPartitionKey]) -> dict[TopicPartitionKey, tuple[int, int]]:
        """(low, high) per partition; high is the last stable offset (next committed record's offset)."""
        if not partitions:
            return {}
        low = self._list(partitions, OffsetSpec.earliest())
        high = self._list(partitions, OffsetSpec.latest())
        return {tp: (max(low[tp], 0), max(high[tp], 0)) for tp in partitions}

    def log_ends(self, partitions: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """The log end offset per partition, open transactions included (read_uncommitted).

        A read_committed reader whose position reaches it has seen every transaction that began
        before the call, decided; one that stops at the last stable offset has not, when another
        writer's transaction is open (or its markers not yet written) below records committed later.
        """
        ends = self._list(partitions, OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED)
        return {tp: max(end, 0) for tp, end in ends.items()}

    def _list(self, partitions: list[TopicPartitionKey], spec: OffsetSpec,
              isolation: IsolationLevel = IsolationLevel.READ_COMMITTED) -> dict[TopicPartitionKey, int]:
        request = {TopicPartition(topic, partition): spec for topic, partition in partitions}
        futures = self._admin.list_offsets(request, isolation_level=isolation, request_timeout=_METADATA_TIMEOUT_S)
        result = {}
        for tp, future in futures.items():
            try:
                result[(tp.topic, tp.partition)] = future.result(timeout=_METADATA_TIMEOUT_S * 2).offset
            except (KafkaException, TimeoutError) as error:
                raise KafkaUnavailable(
                    f"cannot read offsets of topic={tp.topic} partition={tp.partition}: {error}"
                ) from None
        return result

    def close(self) -> None:
        """Release the client."""
        self._admin = None  # type: ignore[assignment]
