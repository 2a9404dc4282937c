"""The materializer with its state held per key bucket: `transformWithStateInPandas` over hash(key) % N.

The per-key stage (`materializer_stage.MaterializerProcessor`) pays a round trip to the JVM
state server for every state access of every key (about 1.2 ms a key). Here the grouping key is
a bucket of primary keys: one call receives every change of the bucket in the micro-batch as
pandas frames (Arrow underneath), reads the bucket's state once (one JSON document, primary key
-> [rules' state text, event time last touched]), applies the rules to all its keys in memory
(`materializer_bulk`) and writes the bucket back once. The state stays in Spark's state store,
so it is checkpointed with the query exactly like the per-key state, and a replayed micro-batch
decides the same (no wall clock).

Barriers and TTL keep the per-key stage's meaning:
- `batch`: each key's changes of the micro-batch collapse into one net change.
- `watermark`: changes wait in the bucket's `waiting` list until the event-time watermark reaches
  them, then every due change of a key collapses in arrival order; a change arriving behind the
  watermark is applied at once. One timer per bucket, at the earliest waiting event time.
- TTL (`state_ttl_ms`): a key is dropped once the watermark passes its last touched event time
  plus the TTL, when its bucket is next called (by input or by its timer at the earliest expiry).

Initial state (`rebuild-state`): on the first micro-batch of a fresh checkpoint, the rows of
`SEED_SCHEMA` (a primary key, its rules' state text, the event time it counts as touched at) are
merged into their buckets' documents before that batch's changes are applied.

A call's net rows leave as one Arrow IPC value (`net_changes.PACKED_NET_SPARK_SCHEMA`), or, given the
table's primary key, already as the driver's payload rows (`payload.net_payload`,
`PAYLOAD_SPARK_SCHEMA`): typed in the call that made them, with no second Python stage after this one.

The cost per micro-batch is one call per touched bucket plus rewriting those buckets' state, so
the number of buckets trades per-call overhead against rewrite volume (docs/design/materializer-state.md).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Iterator

import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from service.kafka_to_delta.barrier import released
from service.kafka_to_delta.materialize.bucket_document import BucketDocument
from service.kafka_to_delta.materialize.bulk import StageConfig, arrival, compact_many, is_failed
from service.kafka_to_delta.materialize.net_changes import net_table
from service.kafka_to_delta.materialize.payload import net_payload
from service.kafka_to_delta.materialize.rules import Materializer
from service.kafka_to_delta.materialize.rules_columns import compact_columns
from service.kafka_to_delta.rows.ipc import ipc_bytes, unpack_changes, unpack_tables
from service.kafka_to_delta.rows.names import (
    BUCKET,
    EVENT_TIME,
    GROUP,
    PACKED_CHANGES,
    PACKED_COLUMN,
)
from service.runtime.worker_heap import task_started

GROUP_COLUMN = "group_key"  # pandas frames rename columns that start with "_"
_BUCKET_SCHEMA = StructType([StructField("keys", BinaryType())])
_WAITING_SCHEMA = StructType([StructField("record", BinaryType())])
SEED_COLUMNS = (GROUP_COLUMN, "state", "touched")
SEED_SCHEMA = StructType([StructField(GROUP_COLUMN, StringType()), StructField("state", StringType()),
                          StructField("touched", LongType())])
"""Initial state of the bucket stage: one row per primary key (its group key, its rules' state text,
the event time it counts as last touched at for the TTL)."""
WAITING_NAMES = (GROUP, "kind", "upsert_key", "row", "types", "unchanged", "sequence", EVENT_TIME, "topic",
                 "partition", "offset", "change_index", "timestamp")
"""The fields of a change waiting for the watermark (stored as one JSON document each)."""


def _records(frames: Iterator[pd.DataFrame]) -> list[dict]:
    """The bucket's changes as plain Python values: unpacked (`bucket_packing`), or from one row per change
    (through Arrow: no NaN for nulls, no numpy scalars)."""
    records: list[dict] = []
    for frame in frames:
        if PACKED_CHANGES in frame.columns:
            records.extend(unpack_changes(frame[PACKED_CHANGES]))
            continue
        rows = pa.Table.from_pandas(frame, preserve_index=False).to_pylist()
        for record in rows:
            record[GROUP] = record.pop(GROUP_COLUMN)
        records.extend(rows)
    return records


def _document(stored: tuple | None) -> BucketDocument:
    """The bucket's stored keys, from the value of its `keys` state (None: nothing stored)."""
    return BucketDocument.read(None if stored is None else stored[0])


class BucketProcessor(StatefulProcessor):
    """Applies the rules to every key of a bucket in one call; state: the bucket's keys (one document) and,
    under watermark compaction, the bucket's waiting changes."""

    def __init__(self, config: StageConfig, payload_key: tuple[str, ...] | None = None) -> None:
        self.config = config
        self.payload_key = payload_key  # the table's primary key: emit payload rows instead of packed net rows

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the state variables."""
        task_started()
        self.handle = handle
        self.rules = Materializer(self.config.rules)
        self.keys = handle.getValueState("keys", _BUCKET_SCHEMA)
        if self.config.compaction == "watermark":
            self.waiting = handle.getListState("waiting", _WAITING_SCHEMA)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        """Compact the bucket's changes of this micro-batch (batch), or those the watermark reached."""
        frames = list(rows)
        config = self.config
        if config.decides_on_columns and all(PACKED_CHANGES in frame.columns for frame in frames):
            # The common case on whole columns (`rules_columns`), the rest through the rules.
            changes = unpack_tables(value for frame in frames for value in frame[PACKED_CHANGES])
            if changes is not None:
                yield from self._compact(changes, timerValues.getCurrentWatermarkInMs())
            return
        yield from self._compact(_records(iter(frames)), timerValues.getCurrentWatermarkInMs())

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: TimerValues) -> None:
        """First micro-batch of a fresh checkpoint: merge the seeded keys into the bucket's document."""
        document = _document(self.keys.get())
        ttl_ms = self.config.state_ttl_ms
        seeded = {str(group): (str(state), int(touched) if ttl_ms and touched is not None else None)
                  for group, state, touched in initialState[list(SEED_COLUMNS)].itertuples(index=False)}
        document.replace(seeded, seeded)
        if len(document):
            self.keys.update((document.to_bytes(),))
        expiry = document.next_expiry(ttl_ms)
        if expiry is not None:
            self.handle.registerTimer(int(expiry))

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        """Compact what the watermark reached and drop the keys that outlived the TTL."""
        yield from self._compact([], timerValues.getCurrentWatermarkInMs())

    def _compact(self, arrived: list[dict] | pa.Table, watermark: int) -> Iterator[pd.DataFrame]:
        """`arrived`: the call's changes as records, or as one table when the common case may be decided on
        its columns (`rules_columns`: batch compaction, no TTL, upsert-key mode)."""
        stored = self.keys.get()
        document = _document(stored)
        decided = None
        if isinstance(arrived, pa.Table):
            waiting_from = None
            touched = {g for g in pc.unique(arrived.column(GROUP)).to_pylist() if not is_failed(g)}
            states = document.take(touched)
            decided, due = compact_columns(arrived, states, self.config.row_digests)
        else:
            due, waiting_from = arrived, None
            if self.config.compaction == "watermark":
                due, waiting_from = self._due(arrived, watermark)
            touched = {r[GROUP] for r in due if not is_failed(r[GROUP])}
            states = document.take(touched)  # only the keys this call touches become Python objects
        out = compact_many(self.rules, sorted(due, key=arrival), states, self.config.whole_row_key,
                           self.config.state_ttl_ms, self.config.row_digests)
        document.replace(touched, states)
        dropped = document.expire(self.config.state_ttl_ms, watermark)
        if touched or dropped:
            if len(document):
                self.keys.update((document.to_bytes(),))
            elif stored is not None:
                self.keys.clear()
        for moment in (waiting_from, document.next_expiry(self.config.state_ttl_ms)):
            if moment is not None:
                self.handle.registerTimer(int(moment))
        nets = [table for table in (decided, net_table(out) if out else None) if table is not None]
        if not nets:
            return
        net = pa.concat_tables(nets, promote_options="default")  # the rules' rows carry no typed images
        if self.payload_key is None:
            yield pd.DataFrame({PACKED_COLUMN: [ipc_bytes(net)]})
            return
        payload = net_payload(net, self.payload_key)
        if payload is not None:
            yield pd.DataFrame({name: payload.column(name).to_pylist() for name in payload.schema.names})

    def _due(self, arrived: list[dict], watermark: int) -> tuple[list[dict], int | None]:
        """The waiting and arrived changes the watermark reached (failed rows at once); the rest wait,
        and the earliest event time among them."""
        waiting = [orjson.loads(item[0]) for item in self.waiting.get()]
        failed = [r for r in arrived if is_failed(r[GROUP])]
        pool = waiting + [r for r in arrived if not is_failed(r[GROUP])]
        due, later = released(pool, watermark, itemgetter(EVENT_TIME))
        if later:
            self.waiting.put([(orjson.dumps({name: r.get(name) for name in WAITING_NAMES}),) for r in later])
        elif waiting:
            self.waiting.clear()
        return failed + due, min((r[EVENT_TIME] for r in later), default=None)

    def close(self) -> None:
        """Nothing to release."""


def bucketed(grouped: DataFrame, buckets: int, labels: tuple[int, ...] | None = None) -> DataFrame:
    """`grouped` with its `_group` column renamed for pandas, and the bucket column: a stable hash of the
    group key modulo `buckets`, as its label (`labels`; None: the number). The bucket count and labels are
    part of the checkpointed state's layout."""
    with_bucket = grouped.withColumn(BUCKET, _bucket_of(GROUP, buckets, labels))
    return with_bucket.withColumnRenamed(GROUP, GROUP_COLUMN)


def _bucket_of(column: str, buckets: int, labels: tuple[int, ...] | None) -> Column:
    number = F.pmod(F.xxhash64(column), F.lit(buckets))
    if labels is None:
        return number
    # Nullable, as the bucket numbers' `pmod` and the packed input's column are: the state key's schema.
    return F.try_element_at(F.array(*(F.lit(label).cast("long") for label in labels)), (number + 1).cast("int"))


def bucketed_seed(seed: DataFrame, buckets: int, labels: tuple[int, ...] | None = None) -> DataFrame:
    """The initial state (`SEED_SCHEMA`) with the bucket each primary key belongs to, as the input's."""
    return seed.select(*SEED_COLUMNS).withColumn(BUCKET, _bucket_of(GROUP_COLUMN, buckets, labels))
