"""Where an export stands: the last Delta version whose changes are committed to Kafka.

The position is a record in a compacted positions topic, keyed by the export name, with a
JSON value `{"export": name, "table": uri, "version": n, "state": base64 | null}`. It is
written in the same Kafka transaction as the batch's records, so for a read_committed
reader the records up to version n and the position n appear together or not at all.
`state` is an optional snapshot of the encoder's state taken after encoding version n.

Spark's offset log says which versions a micro-batch covers: `batch_end_version` reads it
from the checkpoint, so a batch without feed rows (a version with no data change) still
moves the position.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from pyspark.sql import SparkSession

from connectors.kafka.transactional_producer import KafkaRecord, PositionRecord, TransactionalProducer
from service.errors import TerminalError

_OFFSET_LOG_VERSION = "v1"
_SOURCE_LINE = 2  # after the format version and the batch metadata


class PositionError(TerminalError):
    """A committed position cannot be understood (written by something else, or corrupted)."""


@dataclass(frozen=True)
class ExportPosition:
    """The last table version an export committed to Kafka, and its encoder state then."""

    export: str
    table: str
    version: int
    state: bytes | None = None

    def to_record(self) -> PositionRecord:
        """The position as the record committed next to a batch."""
        value = {
            "export": self.export, "table": self.table, "version": self.version,
            "state": None if self.state is None else base64.b64encode(self.state).decode("ascii"),
        }
        return PositionRecord(self.export, json.dumps(value, separators=(",", ":")).encode("utf-8"))

    @classmethod
    def from_value(cls, export: str, value: bytes, topic: str) -> "ExportPosition":
        """Parse a committed position value; errors name the topic and the key."""
        where = f"topic={topic} key={export}"
        try:
            document = json.loads(value)
            state = document.get("state")
            return cls(
                export=str(document["export"]), table=str(document["table"]), version=int(document["version"]),
                state=None if state is None else base64.b64decode(state, validate=True),
            )
        except (ValueError, TypeError, KeyError, AttributeError, binascii.Error):
            raise PositionError(f"{where}: the committed export position is not valid") from None


class PositionStore:
    """Reads and advances one export's committed position through its transactional producer."""

    def __init__(self, producer: TransactionalProducer, export: str, table: str) -> None:
        self.producer = producer
        self.export = export
        self.table = table

    def committed(self) -> ExportPosition | None:
        """The last committed position (opens the producer first, so none of ours is pending)."""
        self.producer.open()
        value = self.producer.last_committed_position(self.export)
        if value is None:
            return None
        position = ExportPosition.from_value(self.export, value, self.producer.positions_topic)
        if position.table != self.table:
            raise PositionError(
                f"topic={self.producer.positions_topic} key={self.export}: the export's committed position "
                f"belongs to table {position.table}, not {self.table}; use another export name for a new table"
            )
        return position

    def publish(self, records: list[KafkaRecord], version: int, state: bytes | None = None) -> ExportPosition:
        """Commit `records` and the new position in one transaction; returns the position."""
        position = ExportPosition(self.export, self.table, version, state)
        self.producer.send_batch(records, position.to_record())
        return position


def batch_end_version(spark: SparkSession, checkpoint: str, batch_id: int) -> int | None:
    """One past the last version micro-batch `batch_id` covers, from the checkpoint's offset log.

    Read through Hadoop's file system API, so any checkpoint location Spark can use works.
    None when the log entry is not in the expected format.
    """
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(f"{checkpoint.rstrip('/')}/offsets/{batch_id}")
    stream = path.getFileSystem(spark._jsc.hadoopConfiguration()).open(path)
    try:
        text = jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
    finally:
        stream.close()
    lines = text.splitlines()
    if len(lines) != _SOURCE_LINE + 1 or lines[0] != _OFFSET_LOG_VERSION:
        return None
    try:
        return int(json.loads(lines[_SOURCE_LINE])["version"])
    except (ValueError, KeyError, TypeError):
        return None
