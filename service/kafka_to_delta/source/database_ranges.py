"""A database source's Spark source: every matching topic, each range reduced where it is read.

`spark.readStream.format(database_source_name(database))` plans like the Kafka source, over the
topics the database's pattern routes to a table (`DatabaseSettings.routes`, listed again every
`topic_refresh_seconds`: a new topic is read from its earliest offset, a vanished one is
reported). Each Kafka range is decoded and reduced to its net changes as on a pipeline's plain
path (`partition_changes.PartitionReducer`), with the primary key of its table: the table's
override, else the fields of the range's first Kafka key (Debezium keys a table's topic by its
primary key). Output rows are the plain path's payload rows with the table they belong to.

Small ranges are packed: one Spark task reads several ranges (a database of hundreds of mostly
quiet tables would otherwise cost a task per partition per micro-batch); a task holds up to
`_PACK_ROWS` records, and there are at least as many tasks as cores when there is data. A task's
small ranges (up to `_SMALL_RANGE_ROWS` records) are fetched by one consumer assigned to all their
partitions at once (`range_reader.read_values_of_ranges`); the tables that decode alike are decoded
and reduced in one call keyed by table (`joint_tables`), another table's ranges as one chunk where
they can be, else range by range (`task_payloads`); a larger range is streamed by a consumer of its own.
When a micro-batch has fewer ranges than cores, the largest are first cut in pieces (the
`minPartitions` of the Kafka source, recorded in the offset), so a large table of one partition
is read on every core; the driver merges the pieces as a pipeline's (`batch_changes`).
"""

from __future__ import annotations

import functools
import itertools
import logging
import pickle
import re
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from pyspark import cloudpickle
from pyspark.sql.datasource import DataSource, InputPartition

from connectors.kafka import offsets as om
from connectors.kafka.source import KafkaRange, KafkaSource, KafkaStreamReader
from service.config.databases import DatabaseSettings
from service.kafka_to_delta.rows.payload_spool import PayloadSpool
from service.runtime import quarantine
from service.runtime.memory_release import release_memory
from service.runtime.worker_heap import task_started
from vocabulary.errors import ConfigError, DecodeError, SourceCoordinates

if TYPE_CHECKING:
    import pyarrow as pa

    from connectors.kafka.range_reader import ValueChunk
    from service.kafka_to_delta.source.partition_changes import PartitionReducer

log = logging.getLogger(__name__)
TABLE_COLUMN = "table"
DATABASE_SPARK_SCHEMA = f"{TABLE_COLUMN} string, topic string, primary_key string, part string, payload binary"
_NAME_PREFIX = "cdc_database_"
RESUME_KEY = "$resume"
"""The offset's entry naming the tables read again after quarantine (`runtime.quarantine`)."""
_PACK_ROWS = 50_000
_SMALL_RANGE_ROWS = 5_000


class PackedRanges(InputPartition):
    """Several Kafka ranges read by one task, in turn."""

    def __init__(self, ranges: list[KafkaRange]) -> None:
        super().__init__([r.value for r in ranges])
        self.ranges = ranges


def pack(ranges: list[KafkaRange], min_tasks: int, pack_rows: int = _PACK_ROWS) -> list[PackedRanges]:
    """Ranges into tasks: the largest first into the emptiest task, a task full at `pack_rows`
    records (a range larger than that alone); at least `min_tasks` tasks when there are as many
    ranges. A topic's small ranges go to one task together (it decodes them as one,
    `TableReducers.joined`) when there are at least `min_tasks` such groups. Deterministic: a
    replay plans the same tasks."""
    if not ranges:
        return []
    units = _units(ranges, min_tasks)
    ordered = sorted(units, key=lambda u: (-_rows(u), u[0].topic, u[0].partition, u[0].start))
    total = sum(r.end - r.start for r in ranges)
    count = max(min(min_tasks, len(units)), -(-total // pack_rows))
    count = min(count, len(units))
    tasks: list[list[KafkaRange]] = [[] for _ in range(count)]
    sizes = [0] * count
    for unit in ordered:
        emptiest = min(range(count), key=lambda i: (sizes[i], i))
        tasks[emptiest].extend(unit)
        sizes[emptiest] += _rows(unit)
    return [PackedRanges(sorted(task, key=lambda r: (r.topic, r.partition, r.start))) for task in tasks if task]


def _units(ranges: list[KafkaRange], min_tasks: int) -> list[list[KafkaRange]]:
    """What `pack` places whole: a topic's small ranges together, each large range alone; each range
    alone when there are fewer topics than tasks wanted."""
    by_topic: dict[str, list[KafkaRange]] = {}
    large = []
    for kafka_range in sorted(ranges, key=lambda r: (r.topic, r.partition, r.start)):
        if _small(kafka_range):
            by_topic.setdefault(kafka_range.topic, []).append(kafka_range)
        else:
            large.append([kafka_range])
    if len(by_topic) < min_tasks:
        return [[r] for r in ranges]
    return [*by_topic.values(), *large]


def _rows(unit: list[KafkaRange]) -> int:
    return sum(r.end - r.start for r in unit)


def key_fields(key: bytes | None, decode: Callable[[bytes], tuple[Any, Any]]) -> tuple[str, ...] | None:
    """The field names of a Kafka key (Debezium's key is the row's primary key), or None."""
    if key is None:
        return None
    try:
        document, _ = decode(key)
    except Exception:  # noqa: BLE001 - an undecodable key names no fields; the caller says what to set
        return None
    if isinstance(document, dict) and document:
        return tuple(document)
    return None


class TableReducers:
    """Per range: its table, its primary key and its payload rows (`DATABASE_SPARK_SCHEMA`). Picklable."""

    def __init__(self, database: DatabaseSettings, spool: PayloadSpool | None = None) -> None:
        self.database = database
        self.spool = spool  # where the payloads are handed over in files (`PartitionReducer`)
        self._reducers: dict[tuple[str, ...], PartitionReducer] = {}  # (table with its own decoding, *key)

    def __getstate__(self) -> dict:
        return {"database": self.database, "spool": self.spool, "_reducers": {}}

    def _reducer(self, table: str, primary_key: tuple[str, ...]) -> "PartitionReducer":
        """The reducer of a table: the database's decoding, or the table's own `from_changelog`."""
        changelog = self.database.override(table).from_changelog
        cache_key = (table if changelog is not None else "", *primary_key)
        if cache_key not in self._reducers:
            from service.kafka_to_delta.source.database_decoder import table_decoder
            from service.kafka_to_delta.source.piece_reducer import (
                PieceReducer,  # a large range is cut
            )

            decoder = table_decoder(self.database, primary_key, changelog)
            self._reducers[cache_key] = PieceReducer(decoder, primary_key, spool=self.spool)
        return self._reducers[cache_key]

    def primary_key(self, table: str, kafka_range: KafkaRange, first_key: bytes | None) -> tuple[str, ...]:
        """The table's override, else the fields of the range's first key; none: a `DecodeError`."""
        override = self.database.override(table).primary_key
        if override:
            return tuple(override)
        from service.kafka_to_delta.source.database_decoder import key_decoder

        found = key_fields(first_key, key_decoder(self.database))
        if found is None:
            where = SourceCoordinates(kafka_range.topic, kafka_range.partition, kafka_range.start)
            raise DecodeError(
                f"database {self.database.name}, table {table}: the records have no key with named fields, so "
                f"the primary key is unknown; set `tables: {{{table}: {{primary_key: [...]}}}}`", where)
        return found

    def joined(self, table: str, ranges: list[tuple[KafkaRange, list["ValueChunk"]]]) -> Iterator["pa.RecordBatch"] | None:
        """The payload rows of several small ranges of one table's topic decoded and reduced as one chunk
        (`range_reader.joined_chunk`): what decoding costs per call is paid once for the table. None
        where the ranges must go one by one (`__call__`): a range's first key naming other fields, a
        record the Arrow decode leaves to the record-by-record way (whose errors and TRUNCATEs are
        placed by their range), or placeholders filled across partitions (a range fills only within
        its partition). The payload keeps every change's partition and offset: the driver merges it
        with the table's other ranges as it would the ranges one by one."""
        from connectors.kafka.range_reader import joined_chunk
        from service.kafka_to_delta.source.debezium_columns import decode_range
        from service.kafka_to_delta.source.vector_plan import NotVectorisable

        keys = set()
        chunks = []
        for kafka_range, values in ranges:
            if values:
                keys.add(self.primary_key(table, kafka_range, next((c.first_key for c in values
                                                                    if c.first_key is not None), None)))
                chunks.extend(values)
        if len(keys) != 1:
            return None if keys else iter(())
        primary_key = keys.pop()
        reducer = self._reducer(table, primary_key)
        if reducer.plan is None:
            return None
        chunk = joined_chunk(chunks)
        try:
            columns = decode_range(reducer.plan, reducer.decoder.decode_value, [chunk])
            if columns.odd or (columns.held and len({r.partition for r, _ in ranges}) > 1):
                return None
            payload = reducer.vectorised_payload(columns)
        except NotVectorisable:
            return None
        return iter([self._rows(payload, table, ranges[0][0].topic, primary_key)])

    def together(self, tables: list[tuple[str, list[tuple[KafkaRange, list["ValueChunk"]]]]]
                 ) -> tuple[list["pa.RecordBatch"], set[str]]:
        """The payload rows of several tables' small ranges, the tables that decode alike decoded and
        reduced in one call per group (`joint_tables`), and the topics so done; every other table is
        left to its own decode (`joined`, or range by range), which this never changes the output of."""
        from service.kafka_to_delta.formats.debezium_json import JsonDocuments
        from service.kafka_to_delta.source.joint_tables import (
            TableValues,
            decode_together,
            joint_groups,
        )

        by_reducer: dict[int, tuple["PartitionReducer", list[TableValues]]] = {}
        for table, ranges in tables:
            chunks = [chunk for _, values in ranges for chunk in values]
            if not chunks:
                continue
            try:
                keys = {self.primary_key(table, kafka_range, next((c.first_key for c in values
                                                                   if c.first_key is not None), None))
                        for kafka_range, values in ranges if values}
            except DecodeError:  # raised again, and placed, where the table is decoded alone
                continue
            if len(keys) != 1:
                continue
            primary_key = keys.pop()
            reducer = self._reducer(table, primary_key)
            if reducer.plan is None or not isinstance(reducer.decoder.decode_value, JsonDocuments):
                continue
            by_reducer.setdefault(id(reducer), (reducer, []))[1].append(
                TableValues(table, ranges[0][0].topic, primary_key, chunks))
        batches, done = [], set()
        for reducer, candidates in by_reducer.values():
            assert reducer.plan is not None
            for group in joint_groups(reducer.plan, candidates):
                decoded, _ = decode_together(reducer, group)
                for values, payload in decoded:
                    batches.append(self._rows(payload, values.table, values.topic, values.primary_key))
                    done.add(values.topic)
        return batches, done

    @staticmethod
    def _rows(batch: "pa.RecordBatch", table: str, topic: str, primary_key: tuple[str, ...]) -> "pa.RecordBatch":
        import pyarrow as pa

        rows = batch.num_rows
        return pa.RecordBatch.from_arrays(
            [pa.array([table] * rows, pa.string()), pa.array([topic] * rows, pa.string()),
             pa.array([",".join(primary_key)] * rows, pa.string()), *batch.columns],
            names=[TABLE_COLUMN, "topic", "primary_key", *batch.schema.names])

    def __call__(self, kafka_range: KafkaRange, table: str, read: Callable[[], Iterable["pa.RecordBatch"]],
                 read_values: Callable[[], Iterable["ValueChunk"]]) -> Iterator["pa.RecordBatch"]:

        values: Iterable[ValueChunk] | None = None
        first_key = None
        if not self.database.override(table).primary_key:  # the first key names the key's fields
            chunks = iter(read_values())
            first = next(chunks, None)
            if first is None:  # no record in the range (transaction markers only): nothing to decode
                return
            values = itertools.chain([first], chunks)
            first_key = first.first_key
        primary_key = self.primary_key(table, kafka_range, first_key)
        once = [values]

        def values_once() -> Iterable[ValueChunk]:  # the chunks already begun, then a new read
            begun, once[0] = once[0], None
            return read_values() if begun is None else begun

        for batch in self._reducer(table, primary_key)(read, values_once):
            yield self._rows(batch, table, kafka_range.topic, primary_key)


class DatabaseStreamReader(KafkaStreamReader):
    """Plans the database's topics like the Kafka source; reads packed ranges through `TableReducers`."""

    def __init__(self, options: dict[str, str], database: DatabaseSettings, reducers: bytes, min_tasks: int) -> None:
        super().__init__({**options, "topics": options.get("topics") or "-"})
        self.database = database
        self.reducers = reducers
        self.min_tasks = min_tasks
        self.quarantine_file = {k.lower(): v for k, v in options.items()}.get("quarantinefile", "")
        self.admit = om.cap_rows_by_topic  # each table a micro-batch touches costs a commit
        self._listed_at = 0.0
        self._routes: dict[str, str] = {}

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_routes": dict(self._routes)}

    def _watermarks(self) -> dict[tuple[str, int], tuple[int, int]]:
        now = time.monotonic()
        if now - self._listed_at >= self.database.topic_refresh_seconds or not self._routes:
            self._refresh_routes()
            self._listed_at = now
        self.topics = sorted(self._routes)
        return super()._watermarks()

    def _refresh_routes(self) -> None:
        try:
            routes = self.database.shared_routes(self.cluster.topic_names())
        except ValueError as error:  # two topics naming one table: the configuration must tell them apart
            raise ConfigError(str(error)) from None
        for topic in sorted(set(self._routes) - set(routes)):
            log.warning("database %s: topic %s of table %s is gone; the table keeps what it has",
                        self.database.name, topic, self._routes[topic])
        for topic in sorted(set(routes) - set(self._routes)):
            log.info("database %s: topic %s -> table %s", self.database.name, topic, routes[topic])
        self._routes = routes

    def latestOffset(self, start: dict, limit) -> dict:
        """As the Kafka source; while a table is to be read again after quarantine, the offset says so
        (a micro-batch runs for it even when no topic has new records)."""
        end = super().latestOffset(start, limit)
        resuming = sorted(table for table, entry in quarantine.read(self.quarantine_file).items()
                          if entry.get("state") == quarantine.RESUMING)
        if resuming:
            end = {**end, RESUME_KEY: resuming}
        return end

    def partitions(self, start: dict, end: dict) -> list[PackedRanges]:  # type: ignore[override]
        skipped, rewound = quarantine.topic_states(quarantine.read(self.quarantine_file))
        if rewound:  # a table tried again after quarantine: its topics from where it stopped
            start = {**start, **{topic: {p: o for p, o in offsets.items()} or
                                 {p: 0 for p in end.get(topic, {})} for topic, offsets in rewound.items()}}
        ranges = [r for r in super().partitions(start, end) if r.topic not in skipped]
        return pack(ranges, self.min_tasks)

    def read(self, partition: InputPartition) -> Iterator:  # type: ignore[override]
        from connectors.kafka.range_reader import read_values, read_values_of_ranges

        task_started()
        reducers: TableReducers = pickle.loads(self.reducers)
        packed = partition if isinstance(partition, PackedRanges) else PackedRanges([partition])  # type: ignore[list-item]
        tables: list[tuple[KafkaRange, str]] = []
        for kafka_range in packed.ranges:
            table = self._routes.get(kafka_range.topic) or self.database.table_of(kafka_range.topic)
            if table is not None:
                tables.append((kafka_range, table))
        # The small ranges' values in one pass of one consumer (a consumer per range cost more than
        # reading its records); a large range is streamed by a consumer of its own, never held whole.
        small = read_values_of_ranges(self.client, [_coordinates(r) for r, _ in tables if _small(r)])
        yield from task_payloads(reducers, tables, small, functools.partial(KafkaStreamReader.read, self),
                                 lambda r: read_values(self.client, *_coordinates(r)))
        release_memory()


def task_payloads(reducers: TableReducers, tables: list[tuple[KafkaRange, str]],
                  small: dict[tuple[str, int, int, int], list["ValueChunk"]],
                  read: Callable[[KafkaRange], Iterable["pa.RecordBatch"]],
                  read_large: Callable[[KafkaRange], Iterable["ValueChunk"]]) -> Iterator["pa.RecordBatch"]:
    """A task's payload rows: the tables of its small ranges (values in `small`) that decode alike in one
    call (`TableReducers.together`), a table's small ranges (its topic's partitions) as one where they can
    be (`TableReducers.joined`), the rest range by range; `read` reads a range's records (for the
    record-by-record way), `read_large` streams a large range's values."""
    together: dict[tuple[str, str], list[KafkaRange]] = {}
    for kafka_range, table in tables:
        if _small(kafka_range):
            together.setdefault((table, kafka_range.topic), []).append(kafka_range)
    batches, done = reducers.together([(table, [(r, small[_coordinates(r)]) for r in group])
                                       for (table, _), group in together.items()])
    yield from batches
    joined = {_coordinates(r) for (_, topic), group in together.items() if topic in done for r in group}
    for (table, topic), group in together.items():
        if len(group) > 1 and topic not in done:
            payload = reducers.joined(table, [(r, small[_coordinates(r)]) for r in group])
            if payload is not None:
                yield from payload
                joined.update(_coordinates(r) for r in group)
    for kafka_range, table in tables:
        if _coordinates(kafka_range) in joined:
            continue
        if _small(kafka_range):
            values = functools.partial(iter, small[_coordinates(kafka_range)])
        else:
            values = functools.partial(read_large, kafka_range)
        yield from reducers(kafka_range, table, functools.partial(read, kafka_range), values)


def _coordinates(kafka_range: KafkaRange) -> tuple[str, int, int, int]:
    return kafka_range.topic, kafka_range.partition, kafka_range.start, kafka_range.end


def _small(kafka_range: KafkaRange) -> bool:
    """A range read together with the task's other small ones (its values held until decoded)."""
    return kafka_range.end - kafka_range.start <= _SMALL_RANGE_ROWS


def database_source_name(database: str) -> str:
    """The format name of one database source."""
    return _NAME_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", database)


def database_source(database: DatabaseSettings, min_tasks: int, spool: PayloadSpool | None = None) -> type[DataSource]:
    """A data source class for one database (register it with `spark.dataSource.register`); with a `spool`,
    its payloads are handed to the driver in the spool's files (`rows.payload_spool`)."""
    format_name = database_source_name(database.name)
    pickled = cloudpickle.dumps(TableReducers(database, spool))

    class DatabaseSource(KafkaSource):
        """Every table of the database, each range as its table's net changes."""

        @classmethod
        def name(cls) -> str:
            return format_name

        def schema(self) -> str:
            return DATABASE_SPARK_SCHEMA

        def streamReader(self, schema) -> DatabaseStreamReader:
            return DatabaseStreamReader(dict(self.options), database, pickled, min_tasks)

    return DatabaseSource
