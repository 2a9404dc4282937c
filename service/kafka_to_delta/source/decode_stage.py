"""Kafka records -> changelog rows where each Kafka range is read (`DecodedRanges`, read through
`changes_source`), under the pipeline's FROM_CHANGELOG configuration and input format (JSON, or
Avro in the Confluent wire format).

When several topics feed one table, each upsert key is prefixed with its topic: two sources
claiming the same key are different upsert keys, which is what the materializer's
`on_conflict` is about.
"""

from __future__ import annotations

import json
from typing import Callable, Iterable, Iterator

import pyarrow as pa

from connectors.kafka.range_reader import FLOOR_COLUMN, ValueChunk
from service.config.registry import SchemaRegistrySettings
from service.config.settings import PipelineSettings
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder
from service.kafka_to_delta.formats.debezium_json import DocumentDecoder
from service.kafka_to_delta.rows.arrow import CHANGELOG_SCHEMA, STREAM_SCHEMA
from service.kafka_to_delta.rows.names import Column
from service.kafka_to_delta.source.changelog_columns import BulkChangelog, RangeChangelog
from service.kafka_to_delta.source.decode_report import DecodeWays
from service.kafka_to_delta.source.event_time_progress import EventTimeMaxima, PartitionWatermark
from vocabulary.errors import ConfigError


def value_decoder(format_name: str, registry: SchemaRegistrySettings | None) -> DocumentDecoder | None:
    """The record value decoder of an input format; None: JSON (the decoder's default)."""
    if format_name != "avro-confluent":
        return None
    if registry is None:
        raise ConfigError("format avro-confluent needs `schema_registry: {url: ...}`")
    # Imported here: a JSON-only service never loads the registry client. The client pickles as
    # its connection; each executor builds its own on first use.
    from connectors.schema_registry import ConfluentAvroDecoder, SchemaRegistryClient

    return ConfluentAvroDecoder(SchemaRegistryClient(connection=registry.connection()))


def batch_decoder(pipeline: PipelineSettings) -> ChangelogBatchDecoder:
    """The picklable decoder of one pipeline (its format and FROM_CHANGELOG settings)."""
    return ChangelogBatchDecoder(
        pipeline.changelog_settings, pipeline.primary_key, pipeline.effective_upsert_key,
        value_decoder=value_decoder(pipeline.format, pipeline.schema_registry),
        ignore_null_updates=pipeline.table_shape.ignore_null_updates,
    )


def _topic_scoped(batch: pa.RecordBatch) -> pa.RecordBatch:
    topics = batch.column(Column.TOPIC).to_pylist()
    keys = batch.column(Column.UPSERT_KEY).to_pylist()
    scoped = [None if k is None else json.dumps([t, json.loads(k)], separators=(",", ":"))
              for t, k in zip(topics, keys)]
    index = batch.schema.get_field_index(Column.UPSERT_KEY)
    return batch.set_column(index, Column.UPSERT_KEY, pa.array(scoped, pa.string()))


class _Decode:
    """The `mapInArrow` function (a picklable callable): changelog rows plus each row's watermark
    candidate; the largest event time per partition goes to `maxima`."""

    def __init__(self, decoder: BulkChangelog, scope_by_topic: bool, maxima: EventTimeMaxima | None,
                 ways: DecodeWays | None = None) -> None:
        self.decoder = decoder
        self.scope_by_topic = scope_by_topic
        self.maxima = maxima
        self.ways = ways

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The rows of a range read as record batches (`read_range`)."""
        decode = self.decoder.range_decoder()
        yield from self._rows(decode, ((decode(batch), _floor(batch)) for batch in batches))

    def chunks(self, chunks: Iterable[ValueChunk]) -> Iterator[pa.RecordBatch]:
        """The rows of a range read as value chunks that keep their records (`read_values` with
        `keep_records`)."""
        decode = self.decoder.range_decoder()
        yield from self._rows(decode, ((decode.chunk(chunk), chunk.floor) for chunk in chunks))

    def _rows(self, decode: RangeChangelog, decoded: Iterable[tuple[pa.RecordBatch, int | None]]) -> Iterator[pa.RecordBatch]:
        watermark = PartitionWatermark()
        for rows, floor in decoded:
            if self.scope_by_topic:
                rows = _topic_scoped(rows)
            yield _with_candidates(rows, watermark.candidates(floor, rows))
        if self.maxima is not None:
            self.maxima.report(watermark.maxima)
        if self.ways is not None:
            self.ways.report(decode)


def _with_candidates(decoded: pa.RecordBatch, candidates: pa.Array) -> pa.RecordBatch:
    """`STREAM_SCHEMA`'s rows: the changelog rows and their watermark candidates; typed image columns
    (`changelog_columns` with `typed`) after them."""
    if decoded.num_columns == len(CHANGELOG_SCHEMA):
        return pa.RecordBatch.from_arrays([*decoded.columns, candidates], schema=STREAM_SCHEMA)
    extra = decoded.schema.names[len(CHANGELOG_SCHEMA):]
    schema = pa.schema([*STREAM_SCHEMA, *(decoded.schema.field(name) for name in extra)])
    return pa.RecordBatch.from_arrays([*decoded.columns[:len(CHANGELOG_SCHEMA)], candidates,
                                       *(decoded.column(name) for name in extra)], schema=schema)


class DecodedRanges:
    """What a Kafka range becomes where it is read on the stateful paths (`changes_source` with
    `STREAM_SPARK_SCHEMA`): its changelog rows and watermark candidates, decoded in the reading task,
    so the raw records never cross to the JVM and back to a second Python stage. Picklable.

    `bulk`: the rows go to the bucket stage, which reads `STAGE_FIELDS` only: values that declare their
    columns (Avro, JSON with schema blocks) are decoded in bulk where they can be (`changelog_columns`, `snapshot` left null), and how each range went is
    reported to `ways`; otherwise record by record. `typed`: the rows decoded in bulk also carry their typed
    image columns (for a bucket stage that passes them on to its payload)."""

    def __init__(self, pipeline: PipelineSettings, maxima: EventTimeMaxima | None, bulk: bool = False,
                 ways: DecodeWays | None = None, typed: bool = False) -> None:
        decoder = batch_decoder(pipeline)
        ranges = BulkChangelog(decoder, tuple(pipeline.primary_key) if bulk else None, typed)
        self.decode = _Decode(ranges, len(pipeline.topics) > 1, maxima, ways)

    def __call__(self, read: Callable[[], Iterable[pa.RecordBatch]],
                 read_values: Callable[..., Iterable[ValueChunk]] | None = None) -> Iterator[pa.RecordBatch]:
        """The range's changelog batches (`read` yields its record batches; `read_values`, its value chunks,
        is read where given: a quarter of the work per record on Debezium's records, whose context headers
        cost most of a record batch, and the decode builds a record's headers only where its rows keep them)."""
        if read_values is not None:
            yield from self.decode.chunks(read_values(keep_records=True))
        else:
            yield from self.decode(iter(read()))


def _floor(batch: pa.RecordBatch) -> int | None:
    """The watermark floor a range's record batch was read with."""
    return batch.column(FLOOR_COLUMN)[0].as_py() if batch.num_rows else None
