"""The export's encoder: TO_CHANGELOG, then the record layout, for one flush of the change feed.

The layouts themselves are in `output_formats` (row by row), `columnar_records` (JSON, column
by column) and `columnar_avro_records` (Avro, column by column); this module chooses between
them per flush, so all build on names below it.
"""

from __future__ import annotations

import time as walltime
from collections.abc import Callable, Iterator, Mapping

import pyarrow as pa

from service.config.exports import ChangeFeedColumn, ExportSettings
from service.delta_to_kafka.changelog.changelog_state import StateRecord
from service.delta_to_kafka.changelog.feed_changes import (
    NO_ROW,
    FeedChanges,
    changes_feed,
    pair_changes,
    plain_strings,
)
from service.delta_to_kafka.changelog.to_changelog import ToChangelog
from service.delta_to_kafka.formats.columnar_records import ColumnarRecords
from service.delta_to_kafka.formats.output_formats import (
    KafkaRecord,
    KafkaRecordEncoder,
    ValueSerializer,
)


def _columnar(settings: ExportSettings, key: ValueSerializer | None,
              value: ValueSerializer | None) -> ColumnarRecords | None:
    """The column-by-column layout of the export, None where only the row path writes it."""
    if settings.format != "avro-confluent":
        return ColumnarRecords(settings)
    if not (hasattr(key, "registered") and hasattr(value, "registered")):
        return None  # serializers other than the table's own: their schema is theirs
    # Imported here: a JSON-only service never loads the registry client.
    from service.delta_to_kafka.formats.columnar_avro_records import ColumnarAvroRecords

    return ColumnarAvroRecords(settings, key, value)  # type: ignore[arg-type]


SLICE_CHANGES = 10_000
"""Changes encoded together in a lazily encoded flush (`ExportEncoder.slices`): long enough that
the column operations' fixed costs vanish, short enough that a run's texts are a few MB."""


def _python_columns(table: pa.Table) -> list[list]:
    """Each column's Python values (a column's `to_pylist` is faster than the table's, a dict per row)."""
    return [column.to_pylist() for column in table.columns]


class ExportEncoder:
    """TO_CHANGELOG and the record layout together: one flush of the change feed -> Kafka records.

    Callable as the export pipeline's encoder, and its `EncoderState` (state records per key). The
    clock gives epoch seconds: the state's TTL and the envelope's `ts_ms` both use it.

    A flush is encoded column by column (`feed_changes` pairs and compacts in Arrow,
    `columnar_records` or, for Avro with the table's own serializers, `columnar_avro_records`
    writes the layout) whenever the flush needs no encoder state; otherwise TO_CHANGELOG runs
    row by row. Both give the same bytes.
    """

    def __init__(
        self,
        settings: ExportSettings,
        key_serializer: ValueSerializer | None = None,
        value_serializer: ValueSerializer | None = None,
        clock: Callable[[], float] = walltime.time,
    ) -> None:
        self.changelog = ToChangelog(settings)
        self.records = KafkaRecordEncoder(settings, key_serializer, value_serializer)
        self.columnar = _columnar(settings, key_serializer, value_serializer)
        self._clock = clock

    @property
    def stateless(self) -> bool:
        """True when no flush leaves state for the next (retract input): flushes may be encoded in any order."""
        return self.changelog.stateless

    def __call__(self, feed: pa.Table) -> list[KafkaRecord]:
        """The Kafka records of one flush, in order."""
        return [record for part in self.slices(feed) for record in part]

    def slices(self, feed: pa.Table) -> Iterator[list[KafkaRecord]]:
        """The Kafka records of one flush, in order, a run of `SLICE_CHANGES` changes at a time.

        A flush that needs no encoder state at all is encoded lazily, run after run, as the
        caller takes them: a batch's records are published while the next run is encoded, and
        only one run's texts are held at a time. Any other flush is encoded whole, now (its
        state is up to date when this returns)."""
        now = self._clock()
        processed_at_ms = int(now * 1000)
        paired = self._paired(feed)
        if paired is not None and self.changelog.stateless:
            return self._runs(feed, *paired, now, processed_at_ms)
        records = None if paired is None else self._encoded(*paired, processed_at_ms)
        if records is not None:
            self._remember_images(feed, now)
            return iter([records])
        return iter([self._row_path(feed, now, processed_at_ms)])

    def _by_column(self, feed: pa.Table, processed_at_ms: int) -> list[KafkaRecord] | None:
        """The whole flush encoded column by column; None when it needs the row path."""
        paired = self._paired(feed)
        return None if paired is None else self._encoded(*paired, processed_at_ms)

    def _row_path(self, feed: pa.Table, now: float, processed_at_ms: int) -> list[KafkaRecord]:
        return self.records.encode(self.changelog.encode_flush(feed, now), processed_at_ms=processed_at_ms)

    def _paired(self, feed: pa.Table) -> tuple[pa.Table, FeedChanges] | None:
        """The flush's plain-string feed and its changes where it is encoded column by column; None
        when it needs the row path (state, errors, Avro through other serializers)."""
        if self.columnar is None or not self.changelog.pairs_alone:
            return None
        settings = self.changelog.settings
        self.changelog.check_columns(feed)
        plain = plain_strings(feed)
        changes = pair_changes(plain, settings.primary_key, settings.compaction == "per-flush")
        return None if changes is None else (plain, changes)

    def _encoded(self, plain: pa.Table, changes: FeedChanges, processed_at_ms: int) -> list[KafkaRecord] | None:
        """Changes encoded column by column; None for a value without a JSON or Avro form (the row path names it)."""
        try:
            return self.columnar.encode(*changes_feed(plain, changes), processed_at_ms)  # type: ignore[union-attr]
        except TypeError:
            return None

    def _runs(self, feed: pa.Table, plain: pa.Table, changes: FeedChanges, now: float,
              processed_at_ms: int) -> Iterator[list[KafkaRecord]]:
        """The records of a stateless flush, `SLICE_CHANGES` changes at a time. A run the columns
        cannot write sends the flush to the row path, which writes the same bytes: its records
        after those already given follow."""
        given = 0
        for start in range(0, len(changes), SLICE_CHANGES):
            records = self._encoded(plain, changes[start:start + SLICE_CHANGES], processed_at_ms)
            if records is None:
                yield self._row_path(feed, now, processed_at_ms)[given:]
                return
            given += len(records)
            yield records

    def _remember_images(self, feed: pa.Table, now: float) -> None:
        """Upsert input: each commit change's after image into state, as TO_CHANGELOG row by row keeps it."""
        if self.changelog.stateless:
            return
        feed = plain_strings(feed)
        primary_key = self.changelog.settings.primary_key
        changes = pair_changes(feed, primary_key, compact=False)
        if changes is None:
            raise AssertionError("a flush paired for its records did not pair for its state")
        columns = [c for c in feed.column_names if c not in ChangeFeedColumn.ALL]
        keys = list(zip(*_python_columns(feed.select(list(primary_key)).take(pa.array(changes.last)))))
        after = changes.after
        values = _python_columns(feed.select(columns).take(pa.array(after, mask=after == NO_ROW)))
        images = [dict(zip(columns, row)) if at != NO_ROW else None for row, at in zip(zip(*values), after.tolist())]
        self.changelog.remember_images(keys, images, now)

    def snapshot(self) -> bytes:
        """The encoder's whole state after the last flush."""
        return self.changelog.snapshot()

    def restore(self, snapshot: bytes | None) -> None:
        """Continue from a snapshot (None: empty state)."""
        self.changelog.restore(snapshot)

    def state_changes(self) -> list[StateRecord]:
        """State records of the keys touched since the last call (see ChangelogState.changes)."""
        return self.changelog.state_changes()

    def state_entries(self) -> int:
        """How many live state records the state has."""
        return self.changelog.state_entries()

    def restore_state(self, records: Mapping[bytes, bytes]) -> None:
        """Continue from the export's live state records."""
        self.changelog.restore_state(records)
