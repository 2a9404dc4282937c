"""Partition metadata and watermarks through one confluent-kafka client."""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaException, TopicPartition

from connectors.kafka.errors import KafkaUnavailable

_METADATA_TIMEOUT_S = 15.0
TopicPartitionKey = tuple[str, int]


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
    """Partitions and watermark offsets of a set of topics (driver side)."""

    def __init__(self, options: dict[str, str]) -> None:
        self._consumer = Consumer(client_config(options, "metadata"))

    def partitions(self, topics: list[str]) -> list[TopicPartitionKey]:
        """Every partition of the topics that exist now (a missing topic has none yet)."""
        try:
            metadata = self._consumer.list_topics(timeout=_METADATA_TIMEOUT_S)
        except KafkaException as error:
            raise KafkaUnavailable(f"cannot list topics: {error.args[0]}") from None
        found = []
        for topic in topics:
            info = metadata.topics.get(topic)
            if info is not None and info.error is None:
                found.extend((topic, p) for p in sorted(info.partitions))
        return found

    def watermarks(self, partitions: list[TopicPartitionKey]) -> dict[TopicPartitionKey, tuple[int, int]]:
        """(low, high) per partition; high is the next offset a committed record would get."""
        result = {}
        for topic, partition in partitions:
            try:
                low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=_METADATA_TIMEOUT_S, cached=False
                )
            except KafkaException as error:
                raise KafkaUnavailable(
                    f"cannot read watermarks of topic={topic} partition={partition}: {error.args[0]}"
                ) from None
            result[(topic, partition)] = (max(low, 0), max(high, 0))
        return result

    def close(self) -> None:
        """Release the client."""
        self._consumer.close()
