"""The Delta change data feed as a Spark streaming source (Python Data Source API), on delta-rs.

`spark.readStream.format("delta_cdf")` yields the table's change feed: its columns plus
`_change_type` (insert / update_preimage / update_postimage / delete), `_commit_version` and
`_commit_timestamp`, read with `DeltaTable.load_cdf` on the executors. The source offset is
`{"version": n}`, the next commit version to read; Spark keeps it in the checkpoint's offset
log (with maxRowsPerTrigger `{"version": n, "row": r}` while a commit is split: the next row
to read). One input partition reads a run of at most `versionsPerPartition` versions; its rows
are sorted by `_commit_version`, in feed order within a version (with maxRowsPerTrigger: in
canonical order).

Options (keys are case-insensitive):
  path                    required: the table URI
  storageOptions          JSON object of delta-rs storage options (endpoint, credentials)
  startingVersion         first version to read: a number (default 0: the whole history) or
                          `latest` (only versions committed after the query first started)
  startingTimestamp       ISO-8601, instead of startingVersion: the first version committed at
                          or after that instant
  maxVersionsPerTrigger   admission control: at most this many versions per micro-batch
  maxRowsPerTrigger       admission control: at most this many feed rows per micro-batch; a larger
                          commit is split across batches at key boundaries (feed_chunks.py), and
                          every row carries `_commit_row`, its place in its version's canonical order
  keyColumns              comma-separated key columns; required with maxRowsPerTrigger (the rows of
                          one key in one version, e.g. an update's -U and +U, stay in one batch)
  versionsPerPartition    versions one Spark task reads (default 16)

Types handed to Spark: string and binary views or large variants become string / binary,
zoned timestamps `timestamp[us, UTC]`, naive ones `timestamp[us]` (timestamp_ntz), unsigned
integers the next wider signed type; `_commit_version` is int64.

Schema: the table's schema when the query starts. delta-rs reads every version with the
table's latest schema, so an older version has nulls in columns added later. When columns
appear while the query runs (or the table is created after the query started), the source
raises `ChangeFeedSchemaChanged`, a transient error: restarting the query reads the new
schema and carries on from the checkpoint. A table that does not exist yet gives no batches.

Missing history is never skipped silently: a version whose log entry was cleaned up, a gap
in the log, or data files removed by VACUUM raise `ChangeFeedUnavailable` (terminal), naming
the table and the versions.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from connectors.delta.delta_rs import DeltaRsTable
from connectors.delta.feed_chunks import (
    COMMIT_ROW,
    Offset,
    VersionLayout,
    VersionRest,
    canonical_order,
    chunk_and_rest,
    chunk_end,
    number_rows,
)
from vocabulary.errors import ConfigError, TerminalError, TransientError

FORMAT_NAME = "delta_cdf"
CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
FEED_COLUMNS = pa.schema(
    [(CHANGE_TYPE, pa.string()), (COMMIT_VERSION, pa.int64()), (COMMIT_TIMESTAMP, pa.timestamp("us", tz="UTC"))]
)
LATEST = "latest"
DEFAULT_VERSIONS_PER_PARTITION = 16
_VERSION = "version"
_ROW = "row"
READ_AHEAD = 1.25  # of a chunk's rows, read ahead for the next chunk (`version_rows`)
_LAYOUTS_KEPT = 4  # versions whose key layout the driver keeps while it splits them
# Parts of delta-rs error texts that mean "this history is gone", as opposed to a storage hiccup.
_GONE_MARKERS = ("Invalid table version", "Expected contiguous commit files", "not found", "NotFound")


class ChangeFeedUnavailable(TerminalError):
    """Versions the query still needs can no longer be read (log cleanup, VACUUM, a gap)."""


class ChangeFeedSchemaChanged(TransientError):
    """The table has columns the running query does not know; a restart picks them up."""


class ChangeFeedReadError(TransientError):
    """Reading the change feed failed in a way a retry may fix (storage unreachable)."""


def spark_arrow_type(data_type: pa.DataType) -> pa.DataType:
    """The Arrow type Spark accepts for a delta-rs column type (see the module docstring)."""
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type) or pa.types.is_string_view(data_type):
        return pa.string()
    if pa.types.is_large_binary(data_type) or pa.types.is_binary_view(data_type):
        return pa.binary()
    if pa.types.is_timestamp(data_type):
        return pa.timestamp("us", tz="UTC" if data_type.tz else None)
    if pa.types.is_unsigned_integer(data_type):
        return {8: pa.int16(), 16: pa.int32()}.get(data_type.bit_width, pa.int64())
    if pa.types.is_struct(data_type):
        return pa.struct([f.with_type(spark_arrow_type(f.type)) for f in data_type])
    if pa.types.is_map(data_type):
        return pa.map_(spark_arrow_type(data_type.key_type), spark_arrow_type(data_type.item_type))
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_list_view(data_type):
        return pa.list_(spark_arrow_type(data_type.value_type))
    return data_type


def feed_schema(table_schema: pa.Schema | None, numbered: bool = False) -> pa.Schema:
    """The source's Arrow schema: the table's columns (Spark types), the feed columns, `_commit_row` if numbered."""
    columns = [] if table_schema is None else [f.with_type(spark_arrow_type(f.type)) for f in table_schema]
    return pa.schema(columns + list(FEED_COLUMNS) + ([pa.field(COMMIT_ROW, pa.int64())] if numbered else []))


def offset_of(document: dict) -> Offset:
    """(version, row) of a source offset."""
    return int(document[_VERSION]), int(document.get(_ROW, 0))


def offset_document(offset: Offset) -> dict:
    """A source offset; the row only while a version is split (so whole-version offsets stay `{"version": n}`)."""
    version, row = offset
    return {_VERSION: version, _ROW: row} if row else {_VERSION: version}


def _describe(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:300] if lines else type(error).__name__


def read_error(uri: str, first: int, last: int, error: BaseException) -> Exception:
    """A delta-rs failure while reading versions first..last as one of our errors."""
    text = str(error)
    if isinstance(error, TableNotFoundError) or any(marker in text for marker in _GONE_MARKERS):
        return ChangeFeedUnavailable(
            f"table {uri}: the change feed of versions {first}..{last} can no longer be read; its log entries "
            f"or data files were removed (log retention, VACUUM) before they were exported ({_describe(error)})"
        )
    return ChangeFeedReadError(f"table {uri}: reading the change feed of versions {first}..{last} failed: "
                               f"{_describe(error)}")


def conform(feed: pa.Table, schema: pa.Schema, uri: str, first: int, last: int) -> pa.Table:
    """The feed with exactly the columns and types of `schema`; later-added columns are null."""
    unknown = [name for name in feed.column_names if schema.get_field_index(name) < 0]
    if unknown:
        raise ChangeFeedSchemaChanged(
            f"table {uri}: columns {', '.join(unknown)} appeared by version {last}; "
            "restart the query to read them"
        )
    columns = []
    for field in schema:
        if field.name not in feed.column_names:
            columns.append(pa.nulls(feed.num_rows, field.type))
            continue
        try:
            columns.append(feed.column(field.name).cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise ChangeFeedSchemaChanged(
                f"table {uri}: column {field.name} changed type by version {last}; restart the query to read it"
            ) from None
    return pa.Table.from_arrays(columns, schema=schema)


def load_feed(uri: str, storage_options: dict[str, str] | None, first: int, last: int,
              columns: list[str] | None = None) -> pa.Table:
    """The raw change feed of versions first..last (inclusive), as delta-rs gives it."""
    try:
        table = DeltaTable(uri, storage_options=storage_options or None)
        # The arro3 reader is lazy: missing files surface while it is drained.
        return pa.table(table.load_cdf(starting_version=first, ending_version=last, columns=columns))
    except (DeltaError, TableNotFoundError, pa.ArrowException, OSError) as error:
        raise read_error(uri, first, last, error) from None


def stream_feed(uri: str, storage_options: dict[str, str] | None, version: int) -> Iterator[pa.Table]:
    """The raw change feed of one version, batch by batch as delta-rs reads it."""
    try:
        table = DeltaTable(uri, storage_options=storage_options or None)
        for batch in pa.RecordBatchReader.from_stream(table.load_cdf(starting_version=version, ending_version=version)):
            yield pa.Table.from_batches([batch])
    except (DeltaError, TableNotFoundError, pa.ArrowException, OSError) as error:
        raise read_error(uri, version, version, error) from None


def read_versions(
    uri: str, storage_options: dict[str, str] | None, first: int, last: int, schema: pa.Schema
) -> pa.Table:
    """The change feed of versions first..last (inclusive), sorted by version, in `schema`."""
    conformed = conform(load_feed(uri, storage_options, first, last), schema, uri, first, last)
    # sort_indices is stable: feed order within a version is kept.
    return conformed.take(pc.sort_indices(conformed, [(COMMIT_VERSION, "ascending")]))


def _holds_view(data_type: pa.DataType) -> bool:
    """True for a string or binary view type, or a nested type holding one."""
    if pa.types.is_string_view(data_type) or pa.types.is_binary_view(data_type):
        return True
    return any(_holds_view(data_type.field(i).type) for i in range(data_type.num_fields))


def takeable(feed: pa.Table, schema: pa.Schema) -> pa.Table:
    """The raw feed with its nested columns that hold views (a list of string views) in `schema`'s type.

    Top-level view columns stay as they are (`feed_chunks.take_rows` takes them); Arrow has no
    take kernel for views inside a list or struct."""
    for index, field in enumerate(feed.schema):
        nested_view = field.type.num_fields and _holds_view(field.type)
        if nested_view and schema.get_field_index(field.name) >= 0:
            feed = feed.set_column(index, field.name, feed.column(index).cast(schema.field(field.name).type))
    return feed


def version_rows(uri: str, storage_options: dict[str, str] | None, schema: pa.Schema, key_columns: tuple[str, ...],
                 version: int, start_row: int = 0, end_row: int = 0, keys: pa.Table | None = None,
                 rest: VersionRest | None = None) -> pa.Table:
    """Rows [start_row, end_row) of `version` (end_row 0: to its end), canonically ordered and numbered.

    `schema` is the numbered feed schema; `keys` the version's key columns and change types if already read.
    With `rest` (a caller reading a split version chunk after chunk), the chunk comes from the rows
    read ahead by the previous chunk when they cover it, and a chunk that streams the version keeps
    the next `READ_AHEAD` of a chunk's rows there, so a version is streamed about half as often.
    """
    data_schema = pa.schema([f for f in schema if f.name != COMMIT_ROW])
    key_types = pa.schema([data_schema.field(c) for c in key_columns if data_schema.get_field_index(c) >= 0])

    def conformed(rows: pa.Table) -> pa.Table:
        return conform(rows, data_schema, uri, version, version)

    # The raw rows (delta-rs's string views) are ordered and kept as they are and conformed once at
    # the end: the wide values are copied once, not by each of conform, the keys' filter and the sort.
    if start_row == 0 and end_row == 0:
        feed = takeable(load_feed(uri, storage_options, version, version), data_schema)
        return number_rows(conformed(canonical_order(feed, key_columns, key_types)))
    held = None if rest is None else rest.take(uri, version, start_row, end_row)
    if held is not None:
        return held
    if keys is None:
        keys = keys_of(uri, storage_options, version, key_columns)
    ahead = 0 if rest is None or end_row == 0 else int((end_row - start_row) * READ_AHEAD)
    batches = (takeable(batch, data_schema) for batch in stream_feed(uri, storage_options, version))
    chunk, later = chunk_and_rest(keys, batches, data_schema, key_columns, start_row, end_row, ahead,
                                  finish=conformed)
    if later.num_rows:
        rest.keep(uri, version, later, to_end=end_row + later.num_rows >= keys.num_rows)  # type: ignore[union-attr]
    return chunk


def keys_of(uri: str, storage_options: dict[str, str] | None, version: int, key_columns: tuple[str, ...]) -> pa.Table:
    """The key columns and change types of one version's feed, in Spark types."""
    columns = [*key_columns, CHANGE_TYPE]
    feed = load_feed(uri, storage_options, version, version, columns)
    return pa.table([feed.column(c).cast(spark_arrow_type(feed.column(c).type)) for c in columns], names=columns)


def read_batch(uri: str, storage_options: dict[str, str] | None, schema: pa.Schema, start: Offset, end: Offset,
               key_columns: tuple[str, ...] = (), max_rows: int | None = None,
               rest: VersionRest | None = None) -> Iterator[pa.Table]:
    """The feed rows between two source offsets [start, end), in `schema`, a version (or chunk) at a time.

    What Spark's tasks read for a micro-batch, read in the calling process (no JVM round trip):
    with `max_rows` the versions' rows in canonical order with `_commit_row`, a version (or the
    chunk of one) at a time; else runs of `DEFAULT_VERSIONS_PER_PARTITION` versions sorted by
    version, in feed order within one. `rest` keeps a split version's rows read ahead from one
    batch to the next (`version_rows`).
    """
    (first, first_row), (stop, stop_row) = start, end
    last = stop if stop_row else stop - 1
    if not max_rows:
        for run in range(first, last + 1, DEFAULT_VERSIONS_PER_PARTITION):
            yield read_versions(uri, storage_options, run, min(run + DEFAULT_VERSIONS_PER_PARTITION - 1, last), schema)
        return
    for version in range(first, last + 1):
        yield version_rows(uri, storage_options, schema, key_columns, version,
                           first_row if version == first else 0, stop_row if version == stop else 0, rest=rest)


class VersionRange(InputPartition):
    """Commit versions [start, end) of one table for one Spark task.

    With row chunks: the offsets [(start, start_row), (end, end_row)), see feed_chunks.py.
    """

    def __init__(self, start: int, end: int, start_row: int = 0, end_row: int = 0) -> None:
        super().__init__((start, end, start_row, end_row))
        self.start, self.end, self.start_row, self.end_row = start, end, start_row, end_row

    @property
    def last_version(self) -> int:
        """The last version the range has rows of."""
        return self.end if self.end_row else self.end - 1


def _storage_options(lowered: dict[str, str]) -> dict[str, str]:
    raw = lowered.get("storageoptions")
    if not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        raise ConfigError("the delta_cdf option 'storageOptions' must be a JSON object") from None
    if not isinstance(parsed, dict):
        raise ConfigError("the delta_cdf option 'storageOptions' must be a JSON object")
    return {str(k): str(v) for k, v in parsed.items()}


def _positive(lowered: dict[str, str], key: str, default: int | None) -> int | None:
    raw = lowered.get(key)
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"the delta_cdf option '{key}' must be a positive integer")
    return int(raw)


class DeltaChangeFeedSource(DataSource):
    """`spark.readStream.format("delta_cdf").option("path", uri)`: a Delta table's change feed."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def _lowered(self) -> dict[str, str]:
        lowered = {k.lower(): v for k, v in self.options.items()}
        if not lowered.get("path"):
            raise ConfigError("the delta_cdf source needs the option 'path'")
        return lowered

    def schema(self) -> StructType:
        lowered = self._lowered()
        table = DeltaRsTable(lowered["path"], _storage_options(lowered))
        return from_arrow_schema(feed_schema(table.schema(), numbered=bool(lowered.get("maxrowspertrigger"))))

    def streamReader(self, schema: StructType) -> "ChangeFeedStreamReader":
        return ChangeFeedStreamReader(self._lowered(), to_arrow_schema(schema, timezone="UTC"))


class ChangeFeedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans version ranges on the driver; reads them on executors."""

    def __init__(self, lowered: dict[str, str], schema: pa.Schema) -> None:
        self.uri = lowered["path"]
        self.storage_options = _storage_options(lowered)
        self.schema = schema
        self.starting_version = lowered.get("startingversion", "0").strip().lower()
        self.starting_timestamp = lowered.get("startingtimestamp")
        if self.starting_version != LATEST and not self.starting_version.isdigit():
            raise ConfigError("the delta_cdf option 'startingVersion' must be a version number or 'latest'")
        self.max_versions = _positive(lowered, "maxversionspertrigger", None)
        self.per_partition = _positive(lowered, "versionsperpartition", None) or DEFAULT_VERSIONS_PER_PARTITION
        self.max_rows = _positive(lowered, "maxrowspertrigger", None)
        self.key_columns = tuple(c.strip() for c in lowered.get("keycolumns", "").split(",") if c.strip())
        if self.max_rows and not self.key_columns:
            raise ConfigError("the delta_cdf option 'maxRowsPerTrigger' needs 'keyColumns' (the table's primary key)")
        self.target: int | None = None
        self._table: DeltaRsTable | None = None
        self._layouts: dict[int, VersionLayout] = {}

    def __getstate__(self) -> dict:
        # Executors get a copy of the reader for read(); the driver's table handle and layouts stay behind.
        return {**self.__dict__, "_table": None, "_layouts": {}}

    @property
    def table(self) -> DeltaRsTable:
        if self._table is None:
            self._table = DeltaRsTable(self.uri, self.storage_options)
        return self._table

    def _next_version(self) -> int | None:
        """One past the table's latest version; None while the table does not exist."""
        try:
            version = self.table.version()
        except DeltaError as error:
            raise ChangeFeedReadError(f"table {self.uri}: cannot read its latest version: {_describe(error)}") from None
        return None if version is None else version + 1

    def initialOffset(self) -> dict:
        following = self._next_version()
        if self.starting_timestamp:
            return {_VERSION: self._first_version_at(self.starting_timestamp, following)}
        if self.starting_version == LATEST:
            return {_VERSION: following or 0}
        return {_VERSION: int(self.starting_version)}

    def _first_version_at(self, iso: str, following: int | None) -> int:
        try:
            instant = datetime.fromisoformat(iso.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(f"the delta_cdf option 'startingTimestamp' is not ISO-8601: {iso!r}") from None
        if following is None:
            return 0
        if instant.tzinfo is None:
            instant = instant.replace(tzinfo=timezone.utc)
        millis = int(instant.timestamp() * 1000)
        history = DeltaTable(self.uri, storage_options=self.storage_options or None).history()
        later = [c["version"] for c in history if c.get("timestamp", 0) >= millis]
        return min(later) if later else following

    def getDefaultReadLimit(self) -> ReadLimit:
        # The unit of admission control is a commit version.
        return ReadMaxRows(self.max_versions) if self.max_versions else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._next_version()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = offset_of(start)
        following = self._next_version()
        if following is None:
            return offset_document(begin)
        self._check_schema()
        if self.target is not None:
            following = min(following, self.target)
        max_versions = getattr(limit, "max_rows", None) if isinstance(limit, ReadMaxRows) else None
        if self.max_rows:
            return offset_document(chunk_end(begin, following, self.max_rows, max_versions, self._layout))
        end = following if max_versions is None else min(following, begin[0] + max_versions)
        return offset_document((max(end, begin[0]), 0) if end > begin[0] else begin)

    def _keys_of(self, version: int) -> pa.Table:
        """The key columns and change types of one version's feed, in Spark types."""
        return keys_of(self.uri, self.storage_options, version, self.key_columns)

    def _layout(self, version: int) -> VersionLayout:
        """Where the key runs of `version` start (read on the driver: key columns and change types only)."""
        if version not in self._layouts:
            while len(self._layouts) >= _LAYOUTS_KEPT:
                del self._layouts[min(self._layouts)]
            self._layouts[version] = VersionLayout.of(self._keys_of(version), self.key_columns)
        return self._layouts[version]

    def _check_schema(self) -> None:
        table_schema = self.table.schema()
        unknown = [] if table_schema is None else [
            f.name for f in table_schema if self.schema.get_field_index(f.name) < 0
        ]
        if unknown:
            raise ChangeFeedSchemaChanged(
                f"table {self.uri}: columns {', '.join(unknown)} appeared after the query started; "
                "restart the query to read them"
            )

    def reportLatestOffset(self) -> dict | None:
        following = self._next_version()
        return None if following is None else {_VERSION: following}

    def partitions(self, start: dict, end: dict) -> list[VersionRange]:
        (first, first_row), (stop, stop_row) = offset_of(start), offset_of(end)
        last = stop if stop_row else stop - 1
        ranges = []
        for s in range(first, last + 1, self.per_partition):
            e = min(s + self.per_partition, last + 1)
            end_offset = (stop, stop_row) if e > last else (e, 0)
            ranges.append(VersionRange(s, end_offset[0], first_row if s == first else 0, end_offset[1]))
        return [r for r in ranges if (r.start, r.start_row) < (r.end, r.end_row)]

    # Spark hands back the partitions planned above: narrower than the base's InputPartition.
    def read(self, partition: VersionRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        if not self.max_rows:
            table = read_versions(self.uri, self.storage_options, partition.start, partition.end - 1, self.schema)
            yield from table.to_batches()
            return
        for version in range(partition.start, partition.last_version + 1):
            start_row = partition.start_row if version == partition.start else 0
            end_row = partition.end_row if version == partition.end else 0
            yield from self._version_rows(version, start_row, end_row).to_batches()

    def _version_rows(self, version: int, start_row: int, end_row: int) -> pa.Table:
        """Rows [start_row, end_row) of `version` (end_row 0: to its end), canonically ordered and numbered."""
        return version_rows(self.uri, self.storage_options, self.schema, self.key_columns, version, start_row, end_row)

    def commit(self, end: dict) -> None:
        """Nothing to do: progress lives in the Spark checkpoint."""

    def stop(self) -> None:
        self._table = None
