"""Where an export stands: the last Delta version whose changes are committed to Kafka.

The position is a record in a compacted positions topic, keyed by the export name, with a
JSON value `{"export": name, "table": uri, "version": n, "state": {"topic": t, "entries": k} | null}`.
It is written in the same Kafka transaction as the batch's records, so for a read_committed
reader the records up to version n and the position n appear together or not at all. When a
batch ended inside a commit (`max_rows_per_trigger`), the value also has `"row": r`: the first
r feed rows of version n + 1, in the source's canonical order (`_commit_row`), are committed too.

The encoder's state (TO_CHANGELOG's previous images and pending update-befores, spec 4.2.1.3)
is NOT in the position: with `input_changelog: upsert` it holds an image of every key, far
beyond a broker's message size limit. It lives in a compacted state topic of its own per
export, one record per primary key (`ChangelogState.changes`), a tombstone once the key has
no entry. Each transaction carries, besides the batch's records and the position, the state
records of the keys the batch touched. So the state topic read to its end (read_committed,
last value per key) is exactly the state after the committed position's version: state,
records and position commit or abort together, and exactly-once is unchanged. The position
says only where the state is and how many live records it must have (`entries`), which keeps
it a few hundred bytes whatever the table's size; `restore_encoder_state` checks that count,
so a deleted or truncated state topic fails the export (terminal) instead of silently
re-encoding with lost state. On (re)open the state is read back before the first batch.

Re-deriving the state from the Delta table at the position's version was the alternative. It
was not chosen: pending update-befores and the entries' TTL clocks (processing time, spec
4.3.2) are not in the table, time travel to that version fails once the table is vacuumed,
and it reads the whole table, not only the keys that hold state.

A position written before the state topic existed carries the whole state as base64 in
`state`; it is restored once and written to the state topic with the next batch.

Spark's offset log says which versions a micro-batch covers: `batch_end_offset` reads it
from the checkpoint, so a batch without feed rows (a version with no data change) still
moves the position.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Protocol

from pyspark.sql import SparkSession

from connectors.kafka.transactional_producer import (
    KafkaRecord,
    PositionRecord,
    StateRecord,
    TransactionalProducer,
)
from service.delta_to_kafka.changelog.changelog_state import StateRestoreError
from vocabulary.errors import TerminalError

DEFAULT_POSITIONS_TOPIC = "cdc-lakehouse.export-positions"
TRANSACTIONAL_ID_PREFIX = "cdc-lakehouse-export-"  # + the export name: its producer's transactional id
_OFFSET_LOG_VERSION = "v1"
_SOURCE_LINE = 2  # after the format version and the batch metadata


class PositionError(TerminalError):
    """A committed position cannot be understood (written by something else, or corrupted)."""


class EncoderState(Protocol):
    """State an encoder keeps between flushes (previous images, pending updates), as keyed records."""

    def state_changes(self) -> list[StateRecord]:
        """State records (key, value or None to delete) of the keys touched since the last call."""

    def state_entries(self) -> int:
        """How many live state records the state has now."""

    def restore_state(self, records: Mapping[bytes, bytes]) -> None:
        """Continue from these live state records (empty: from empty state)."""

    def restore(self, snapshot: bytes | None) -> None:
        """Continue from a whole-state snapshot of an older position; its keys go out with the next changes."""


@dataclass(frozen=True)
class ExportPosition:
    """The last table version an export committed to Kafka, and where its encoder state is."""

    export: str
    table: str
    version: int
    state_topic: str | None = None
    state_entries: int = 0
    legacy_state: bytes | None = None  # a whole-state snapshot from a position of the older format
    row: int = 0  # feed rows of version + 1 committed too (a batch that ended inside a commit)

    @property
    def next_offset(self) -> tuple[int, int]:
        """(version, row) of the first feed row not yet committed."""
        return self.version + 1, self.row

    def to_record(self) -> PositionRecord:
        """The position as the record committed next to a batch."""
        state = None if self.state_topic is None else {"topic": self.state_topic, "entries": self.state_entries}
        value = {"export": self.export, "table": self.table, "version": self.version, "state": state}
        if self.row:
            value["row"] = self.row
        return PositionRecord(self.export, json.dumps(value, separators=(",", ":")).encode("utf-8"))

    @classmethod
    def from_value(cls, export: str, value: bytes, topic: str) -> "ExportPosition":
        """Parse a committed position value; errors name the topic and the key."""
        try:
            document = json.loads(value)
            position = cls(str(document["export"]), str(document["table"]), int(document["version"]),
                           row=int(document.get("row", 0)))
            state = document.get("state")
            if isinstance(state, str):
                return replace(position, legacy_state=base64.b64decode(state, validate=True))
            if state is not None:
                return replace(position, state_topic=str(state["topic"]), state_entries=int(state["entries"]))
            return position
        except (ValueError, TypeError, KeyError, AttributeError, binascii.Error):
            raise PositionError(f"topic={topic} key={export}: the committed export position is not valid") from None


class PositionStore:
    """Reads and advances one export's committed position (and state) through its transactional producer."""

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

    def committed_state(self, position: ExportPosition | None) -> dict[bytes, bytes]:
        """The live state records at `position`; PositionError unless the state topic holds exactly those."""
        topic = self.producer.state_topic
        where = f"topic={self.producer.positions_topic} key={self.export}"
        if position is not None and position.state_topic not in (None, topic):
            raise PositionError(f"{where}: the export's state is in topic {position.state_topic}, not {topic}")
        records = self.producer.committed_state()
        expected = 0 if position is None or position.state_topic is None else position.state_entries
        if len(records) != expected:
            at = "no committed position" if position is None else f"a committed position (version {position.version})"
            raise PositionError(
                f"topic={topic}: holds {len(records)} live state records, but export {self.export} has {at} with "
                f"{expected}; the state topic was changed or deleted: publish the table again under another export "
                "name (or delete this state topic if the export is new)"
            )
        return records

    def publish(self, records: Iterable[KafkaRecord], version: int, state: list[StateRecord] | None = None,
                state_entries: int = 0, row: int = 0) -> ExportPosition:
        """Commit `records`, the `state` records and the new position in one transaction; returns the position.

        `state` None: this export keeps no encoder state; else `state_entries` live state records remain.
        `row` > 0: the batch ended inside version `version + 1`, after that many of its feed rows.
        """
        state_topic = None if state is None else self.producer.state_topic
        position = ExportPosition(self.export, self.table, version, state_topic, state_entries, row=row)
        self.producer.send_batch(records, position.to_record(), state or ())
        return position


def restore_encoder_state(store: PositionStore, position: ExportPosition | None, state: EncoderState) -> None:
    """Bring `state` to the committed `position`: from the state topic, or once from an older position's snapshot."""
    records = store.committed_state(position)
    try:
        if position is not None and position.legacy_state is not None:
            state.restore(position.legacy_state)
        else:
            state.restore_state(records)
    except StateRestoreError as error:
        raise StateRestoreError(f"topic={store.producer.state_topic} export={store.export}: {error}") from None


def batch_end_offset(spark: SparkSession, checkpoint: str, batch_id: int) -> tuple[int, int] | None:
    """(version, row) where micro-batch `batch_id` ends (exclusive), from the checkpoint's offset log.

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
        offset = json.loads(lines[_SOURCE_LINE])
        return int(offset["version"]), int(offset.get("row", 0))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
