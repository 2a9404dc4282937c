"""One export as a Spark streaming query: Delta change feed -> encoder -> Kafka, exactly once.

Spark plans the micro-batches (the change-feed source's offsets, its offset log, the
checkpoint); the rows are not read through Spark. Per micro-batch (the barrier): take the
batch's offsets from the offset log (its end; its start is the previous batch's end, or the
query's first offset), read the feed rows between them with delta-rs in the driver's process
(`connectors.delta.change_feed.read_batch`: the same rows, order and `_commit_row` the
source's tasks would give, without the Arrow -> JVM -> Arrow round trip), sorted by
`_commit_version` (feed order within a version; with `max_rows_per_trigger` by `_commit_row`);
read nothing at or before the position committed in Kafka; encode the rest; publish the records
and the new position (where the batch ends, from Spark's offset log: the last whole version
and, when the batch ended inside a commit, how many rows of the next) in one Kafka transaction.
With `max_rows_per_trigger` a batch holds a bounded number of feed rows, so the driver's
memory follows that bound, not the largest commit; a commit's rows of one key (an update's -U
and +U) are never split (connectors/delta/feed_chunks.py).

Commit order, enforced by `_process_batch` returning only after the Kafka commit:
  1. the Kafka transaction commits the batch's records AND the export position;
  2. Spark then marks the batch done in its checkpoint's commit log.
A crash between 1 and 2 makes Spark replay the batch (the same versions, from its offset
log) on restart; they are at or below the committed position, so the batch is skipped. A
crash before 1 leaves the transaction open or aborted: the restarted producer's
`init_transactions` aborts it and the replayed batch is published anew. Because only
versions above the committed position are ever published, a lost checkpoint restarted from
an older starting version publishes no version twice either. To publish a table again from
the start, use a new export name (it is the transactional id and the position key).

An optional encoder state (`EncoderState`) goes to the export's compacted state topic, one
record per key the batch touched, in the same transaction (export_position.py says why
there and not in the position record). It is read back from that topic whenever the producer
is (re)opened, so state and published records never diverge.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from typing import Callable, Iterator, Literal, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import StructType

from connectors.delta.change_feed import (
    COMMIT_VERSION,
    FORMAT_NAME,
    ChangeFeedStreamReader,
    DeltaChangeFeedSource,
    offset_document,
    offset_of,
    read_batch,
)
from connectors.delta.feed_chunks import COMMIT_ROW, Offset, VersionRest
from connectors.kafka.transactional_producer import KafkaRecord, TransactionalProducer
from service.delta_to_kafka.export_position import (
    DEFAULT_POSITIONS_TOPIC,
    TRANSACTIONAL_ID_PREFIX,
    EncoderState,
    ExportPosition,
    PositionError,
    PositionStore,
    batch_end_offset,
    restore_encoder_state,
)
from service.delta_to_kafka.read_ahead import EncodedAhead, ReadAhead
from service.observability import metrics
from service.runtime.checkpoints import local_path, remove_abandoned_writes
from service.supervisor.batch_pipeline import BatchPipeline, with_trigger

log = logging.getLogger(__name__)

Encoder = Callable[[pa.Table], list[KafkaRecord]]
STATE_TOPIC_PREFIX = "cdc-lakehouse.export-state."
DEFAULT_MAX_VERSIONS_PER_TRIGGER = 100


@runtime_checkable
class SlicedEncoder(Protocol):
    """An encoder that can give a flush's records a run at a time (`ExportEncoder`); `stateless`: it
    holds no state now, so the next flush may be encoded before the one before it is published;
    `restore(None)`: back to empty state."""

    @property
    def stateless(self) -> bool: ...

    def slices(self, feed: pa.Table) -> Iterator[list[KafkaRecord]]: ...

    def restore(self, snapshot: bytes | None) -> None: ...


class EncodedRecords:
    """A flush's records, encoded as the producer takes them: an encoder with `slices` encodes a
    run of changes while librdkafka sends the runs before it, and the batch's records are never
    all held at once. Counts the records and the seconds spent encoding them; `ahead`: the first
    runs, encoded before the batch began (`read_ahead`), and the rest to encode. `then` is called
    once the last record was taken."""

    def __init__(self, encode: Encoder, feed: pa.Table, ahead: EncodedAhead | None = None,
                 then: Callable[[], None] | None = None) -> None:
        self.count = 0
        self.encode_seconds = 0.0
        self.ahead_records = 0
        self._then = then
        self._ahead: list[list[KafkaRecord]]
        self._runs: Iterator[list[KafkaRecord]]
        started = time.monotonic()
        if ahead is not None:
            self._ahead, self._runs = ahead.runs, ahead.rest
            self.ahead_records = sum(len(run) for run in ahead.runs)
        else:  # encoders without runs, and flushes that keep encoder state, are encoded here, whole
            self._ahead = []
            self._runs = encode.slices(feed) if isinstance(encode, SlicedEncoder) else iter([encode(feed)])
        self.encode_seconds += time.monotonic() - started

    def __iter__(self) -> Iterator[KafkaRecord]:
        while self._ahead:
            ahead = self._ahead.pop(0)
            self.count += len(ahead)
            yield from ahead
        while True:
            started = time.monotonic()
            run = next(self._runs, None)
            self.encode_seconds += time.monotonic() - started
            if run is None:
                break
            self.count += len(run)
            yield from run
        if self._then is not None:
            self._then()


def _in_order(feed: pa.Table, keys: list[str]) -> bool:
    """True when the rows are already ascending by `keys` (ties kept in feed order)."""
    if feed.num_rows < 2 or any(feed.column(c).null_count for c in keys):
        return feed.num_rows < 2
    columns = [feed.column(c).to_numpy() for c in keys]
    equal_so_far = np.ones(feed.num_rows - 1, dtype=bool)
    for column in columns:
        earlier, later = column[:-1], column[1:]
        if (equal_so_far & (later < earlier)).any():
            return False
        equal_so_far &= later == earlier
    return True


def sort_feed(feed: pa.Table) -> pa.Table:
    """Rows by commit version (and `_commit_row`); sort_indices is stable, so feed order within a version is kept.

    The reads give the rows in this order already: then the table is returned as it is (no copy)."""
    keys = [c for c in (COMMIT_VERSION, COMMIT_ROW) if c in feed.column_names]
    if _in_order(feed, keys):
        return feed
    return feed.take(pc.sort_indices(feed, [(c, "ascending") for c in keys]))


def after_position(feed: pa.Table, committed: Offset | None) -> pa.Table:
    """The rows at or after the committed position's next offset (all rows when nothing is committed)."""
    if committed is None:
        return feed
    version, row = committed
    later = pc.greater_equal(feed.column(COMMIT_VERSION), version)
    if row == 0:
        return _kept(feed, later)
    if COMMIT_ROW not in feed.column_names:
        raise PositionError(f"the committed export position ends inside version {version} (after {row} feed rows), "
                            "written with max_rows_per_trigger: set max_rows_per_trigger again to continue")
    inside = pc.and_(pc.equal(feed.column(COMMIT_VERSION), version), pc.less(feed.column(COMMIT_ROW), row))
    return _kept(feed, pc.and_(later, pc.invert(inside)))


def _kept(feed: pa.Table, mask: pa.ChunkedArray | pa.Array) -> pa.Table:
    """The rows where `mask` is true; the table itself (no copy) when that is every row."""
    return feed if pc.all(mask).as_py() is True else feed.filter(mask)


def feed_rows(feed: pa.Table) -> pa.Table:
    """The feed without the source's `_commit_row` (the encoder sees the table's columns and the feed's)."""
    return feed.drop_columns([COMMIT_ROW]) if COMMIT_ROW in feed.column_names else feed


class ExportPipeline(BatchPipeline):
    """Runs one export of a Delta table's change feed to a Kafka topic as a streaming query."""

    def __init__(
        self,
        spark: SparkSession,
        name: str,
        table_uri: str,
        output_topic: str,
        kafka_config: dict[str, str],
        checkpoint_dir: str,
        encode: Encoder,
        *,
        storage_options: dict[str, str] | None = None,
        starting_version: int | Literal["latest"] = 0,
        starting_timestamp: datetime | None = None,
        max_versions_per_trigger: int | None = DEFAULT_MAX_VERSIONS_PER_TRIGGER,
        max_rows_per_trigger: int | None = None,
        key_columns: tuple[str, ...] = (),
        positions_topic: str = DEFAULT_POSITIONS_TOPIC,
        trigger_interval_seconds: float = 1.0,
        encoder_state: EncoderState | None = None,
        state_topic: str | None = None,
    ) -> None:
        self.spark = spark
        self.name = name
        self.table_uri = table_uri
        self.output_topic = output_topic
        self.kafka_config = dict(kafka_config)
        self.checkpoint_dir = checkpoint_dir
        self.encode = encode
        self.storage_options = dict(storage_options or {})
        self.starting_version = starting_version
        self.starting_timestamp = starting_timestamp
        self.max_versions_per_trigger = max_versions_per_trigger
        self.max_rows_per_trigger = max_rows_per_trigger
        self._version_rest = VersionRest()  # a split version's rows read ahead for the next batch
        self._read_ahead = ReadAhead(self._plan_end, self._read_rows_ahead, name, self._encode_ahead(),
                                     self._forget_encoding_ahead)
        self.batches_encoded_ahead = 0
        self._feed_schema: pa.Schema | None = None
        self._planner: ChangeFeedStreamReader | None = None
        self._until_idle = False
        self.key_columns = tuple(key_columns)
        self.positions_topic = positions_topic
        self.trigger_interval_seconds = trigger_interval_seconds
        self.encoder_state = encoder_state
        self.state_topic = state_topic or f"{STATE_TOPIC_PREFIX}{name}"
        self.committed_batches = 0
        self.skipped_batches = 0
        self.position: ExportPosition | None = None
        self.failure: BaseException | None = None
        self._store: PositionStore | None = None
        self._opening: Future[PositionStore] | None = None
        self._initial: Offset | None = None

    def _encode_ahead(self) -> Callable[[pa.Table], Iterator[list[KafkaRecord]] | None] | None:
        """How the read-ahead encodes a batch's first runs: only while the encoder holds no state (a
        stateful flush must be encoded after the one before it was published)."""
        encode = self.encode
        if not isinstance(encode, SlicedEncoder):
            return None
        return lambda rows: encode.slices(feed_rows(rows)) if encode.stateless else None

    def _forget_encoding_ahead(self) -> None:
        """Runs encoded ahead were not used: the encoder goes back to the empty state it had before them
        (a flush the row path encodes may leave an update's half waiting in the state)."""
        if isinstance(self.encode, SlicedEncoder):
            self.encode.restore(None)

    @property
    def batches_read_ahead(self) -> int:
        """Batches whose feed rows were read while the batch before them was published."""
        return self._read_ahead.used

    @property
    def transactional_id(self) -> str:
        """The Kafka transactional id of this export (one writer at a time)."""
        return f"{TRANSACTIONAL_ID_PREFIX}{self.name}"

    def _open_store(self) -> PositionStore:
        """The position store with a freshly opened producer; state restored from Kafka.

        `start` opens it in the background while Spark starts the query (opening a transactional
        producer and reading the committed position and state take seconds): the first batch
        waits for that opening and raises what it raised."""
        opening, self._opening = self._opening, None
        if opening is not None:
            opening.result()
        return self._open_store_now()

    def _open_store_now(self) -> PositionStore:
        if self._store is None:
            producer = TransactionalProducer(
                self.kafka_config, self.transactional_id, self.output_topic, self.positions_topic,
                state_topic=None if self.encoder_state is None else self.state_topic,
            )
            store = PositionStore(producer, self.name, self.table_uri)
            self.position = store.committed()
            if self.encoder_state is not None:
                restore_encoder_state(store, self.position, self.encoder_state)
            self._store = store
            log.info("export %s: committed position %s", self.name,
                     "none" if self.position is None else self.position.version)
        return self._store

    def _discard_store(self) -> None:
        # After any failure the outcome of the last commit is unknown: it is re-read on reopen.
        self.position = None
        self.close()

    def _after_failure(self) -> None:
        self._discard_store()

    def _process_batch(self, feed: DataFrame, batch_id: int) -> None:
        store = self._open_store()
        started = time.monotonic()
        spark = feed.sparkSession
        end = batch_end_offset(spark, self.checkpoint_dir, batch_id)
        if end is None:
            raise PositionError(f"export {self.name}: the offset log of micro-batch {batch_id} in "
                                f"{self.checkpoint_dir} is not the change-feed source's")
        committed = None if self.position is None else self.position.next_offset
        if end <= (0, 0):
            return  # no version covered yet (the table does not exist): nothing to publish
        if committed is not None and end <= committed:
            log.info("export %s: batch %d (to %s) already in Kafka, skipped", self.name, batch_id, end)
            self.skipped_batches += 1
            metrics.BATCHES.labels(self.name, "replay_skipped").inc()
            return
        start = self._start_offset(spark, batch_id)
        self._feed_schema = to_arrow_schema(feed.schema, timezone="UTC")
        ahead = self._read_ahead.take(start, end) if committed is None or committed <= start else None
        if ahead is None:  # not read ahead, or the committed position lies inside the range
            rows, encoded = self._read(self._feed_schema, max(start, committed or start), end), None
        else:  # the position is at or before `start`: every row read ahead (and encoded ahead) is fresh
            rows, encoded = ahead.rows, ahead.encoded
        self._read_ahead.start(end)  # the next batch starts where this one ends
        read = time.monotonic()
        fresh = after_position(rows, committed)
        del rows, ahead
        feed_count = fresh.num_rows
        records = EncodedRecords(self.encode, feed_rows(fresh), encoded, then=self._read_ahead.go)
        self.batches_encoded_ahead += encoded is not None
        del fresh, encoded
        state, entries = None, 0
        if self.encoder_state is not None:
            state, entries = self.encoder_state.state_changes(), self.encoder_state.state_entries()
        self.position = store.publish(records, end[0] - 1, state, entries, row=end[1])
        self.committed_batches += 1
        self._record(batch_id, feed_count, records, read - started, time.monotonic() - read)

    def _start_offset(self, spark: SparkSession, batch_id: int) -> Offset:
        """Where the batch starts: the previous batch's end in Spark's offset log, else the query's first offset."""
        if batch_id > 0:
            previous = batch_end_offset(spark, self.checkpoint_dir, batch_id - 1)
            if previous is None:
                raise PositionError(f"export {self.name}: the offset log of micro-batch {batch_id - 1} in "
                                    f"{self.checkpoint_dir} is missing or not the change-feed source's")
            return previous
        return self.initial_offset()

    def initial_offset(self) -> Offset:
        """The source's first offset (startingVersion / startingTimestamp resolved), fixed once per pipeline."""
        if self._initial is None:
            self._initial = offset_of(ChangeFeedStreamReader(self._source_options(), pa.schema([])).initialOffset())
        return self._initial

    def _read(self, schema: pa.Schema, start: Offset, end: Offset) -> pa.Table:
        """The batch's feed rows [start, end), read now (after any read ahead under way ended)."""
        self._read_ahead.drop()
        return self._read_rows(schema, start, end)

    def _read_rows_ahead(self, start: Offset, end: Offset) -> pa.Table:
        if self._feed_schema is None:
            raise PositionError(f"export {self.name}: no batch read yet, nothing to read ahead of")
        return self._read_rows(self._feed_schema, start, end)

    def _plan_end(self, begin: Offset) -> Offset | None:
        """Where Spark will end the batch starting at `begin`, by the source's own planning; None when
        that end is the table's last version, which a new commit would move (unless exporting until idle)."""
        if self._planner is None:
            self._planner = ChangeFeedStreamReader(self._source_options(), self._feed_schema or pa.schema([]))
            if self._until_idle:
                self._planner.prepareForTriggerAvailableNow()
        planner = self._planner
        end = offset_of(planner.latestOffset(offset_document(begin), planner.getDefaultReadLimit()))
        latest = planner.table.version()
        if planner.target is None and (latest is None or end >= (latest + 1, 0)):
            return None
        return end

    def _read_rows(self, schema: pa.Schema, start: Offset, end: Offset) -> pa.Table:
        """The feed rows [start, end) read with delta-rs in this process, sorted (see the module docstring)."""
        if start >= end:
            return schema.empty_table()
        parts = read_batch(self.table_uri, self.storage_options, schema, start, end, self.key_columns,
                           self.max_rows_per_trigger, self._version_rest)
        return sort_feed(pa.concat_tables([schema.empty_table(), *parts]))

    def _record(self, batch_id: int, rows: int, records: EncodedRecords, read_s: float, publish_s: float) -> None:
        """`publish_s`: from the end of the read to the commit, encoding (`records.encode_seconds` of it,
        partly at the same time) included; the runs encoded ahead were encoded before the batch began."""
        metrics.BATCHES.labels(self.name, "committed" if records.count else "empty").inc()
        metrics.STAGE_SECONDS.labels(self.name, "read").observe(read_s)
        metrics.STAGE_SECONDS.labels(self.name, "encode").observe(records.encode_seconds)
        metrics.STAGE_SECONDS.labels(self.name, "encode_publish").observe(publish_s)
        inside = f" and {self.position.row} rows of the next" if self.position.row else ""
        log.info(
            "export %s: batch %d -> %s: versions to %d%s, %d feed rows, %d records, %d of them encoded ahead "
            "(read %.2fs; encode and publish %.2fs, encoding %.2fs of it)",
            self.name, batch_id, self.output_topic, self.position.version, inside, rows, records.count,
            records.ahead_records, read_s, publish_s, records.encode_seconds,
        )

    def close(self) -> None:
        """Release the Kafka producer (call once the query has stopped); a later batch opens a new one."""
        self._read_ahead.close()
        self._planner = None
        self._version_rest.drop()
        opening, self._opening = self._opening, None
        if opening is not None:
            try:
                opening.result()  # its producer is closed below; a failed opening left none
            except Exception:  # noqa: BLE001 - the batch that would have raised it never ran
                log.debug("export %s: the background opening of the position store failed", self.name,
                          exc_info=True)
        store, self._store = self._store, None
        if store is not None:
            store.producer.close()

    def _source_options(self) -> dict[str, str]:
        """The change-feed source's options (lower-case keys)."""
        options = {"path": self.table_uri}
        if self.starting_timestamp is not None:
            options["startingtimestamp"] = self.starting_timestamp.isoformat()
        else:
            options["startingversion"] = str(self.starting_version)
        if self.storage_options:
            options["storageoptions"] = json.dumps(self.storage_options)
        if self.max_versions_per_trigger:
            options["maxversionspertrigger"] = str(self.max_versions_per_trigger)
        if self.max_rows_per_trigger:
            options["maxrowspertrigger"] = str(self.max_rows_per_trigger)
            options["keycolumns"] = ",".join(self.key_columns)
        return options

    def _source(self, struct: StructType) -> DataFrame:
        # The first offset is resolved here, once, and handed to Spark as a version: the batches'
        # reads (`_read`) start where Spark's first batch starts, even for `latest` or a timestamp.
        options = {k: v for k, v in self._source_options().items() if k != "startingtimestamp"}
        options["startingversion"] = str(self.initial_offset()[0])
        return self.spark.readStream.format(FORMAT_NAME).schema(struct).options(**options).load()

    def _fresh_query(self) -> bool:
        """True when the checkpoint (a local one) has planned no batch yet."""
        folder = local_path(self.checkpoint_dir)
        if folder is None:
            return False
        offsets = folder / "offsets"
        return not (offsets.is_dir() and any(offsets.iterdir()))

    def start(self, until_idle: bool) -> StreamingQuery:
        """Start the streaming query; `until_idle` exports what is there now, then ends."""
        remove_abandoned_writes(self.checkpoint_dir)
        self._until_idle, self._planner = until_idle, None
        # The feed's schema, found here in this process and given to Spark: otherwise Spark starts
        # Python workers only to ask the source for it (about a second and a few hundred MB that stay).
        struct = DeltaChangeFeedSource(self._source_options()).schema()
        self._feed_schema = to_arrow_schema(struct, timezone="UTC")
        if self._fresh_query():  # the first batch starts at the first offset: read and encode it while Spark starts
            self._read_ahead.start(self.initial_offset(), bound=False)
            self._read_ahead.go()
        if self._store is None and self._opening is None:
            opener = ThreadPoolExecutor(1, thread_name_prefix=f"open-{self.name}")
            self._opening = opener.submit(self._open_store_now)
            opener.shutdown(wait=False)
        self.spark.dataSource.register(DeltaChangeFeedSource)
        writer = (
            self._source(struct)
            .writeStream.queryName(self.name)
            .foreachBatch(self.process_batch)
            .option("checkpointLocation", self.checkpoint_dir)
        )
        writer = with_trigger(writer, until_idle, self.trigger_interval_seconds)
        return writer.start()
