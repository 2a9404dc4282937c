"""The bucket stage's changes decoded in bulk: a Kafka range's Debezium values (JSON with schema blocks, or
Confluent Avro) -> the changelog rows `ChangelogBatchDecoder` gives for them, without a Python object per
record where it can.

The materializer's bucket stage takes every change of a range, not its net rows, so its decode stage cannot
use the plain path's reduction, and it decoded record by record: on Avro about 40 us a record (fastavro, the
document's JSON forms, FROM_CHANGELOG, the row's text, the fit check) against about 3 us for the bulk Avro
reader. Here each batch goes through the plain path's vectorised decode (`debezium_columns.RangeColumns`
with `with_texts`) up to its changelog rows: the columns parsed by the declared types (JSON by `pyarrow.json`
per schema block; Avro by the bulk reader, in the reference document's form: `avro_columns.SchemaColumns.json_form`)
give each image's text exactly as the record-by-record way writes it (`formats.row_text`; the reference reads
an image as its schema declares it, `changelog.declared_image`, so any valid spelling of the same values gives
the same text), and the rows are laid out as `CHANGELOG_SCHEMA`. The records that decode does not vouch for
(`RangeColumns.odd`: frames, schema ids or bodies the bulk reader refuses, JSON without a schema block among
others with one, unknown op codes, truncates and messages, missing images or keys, values their column type
does not take...) are decoded record by record, alone, and put in their place by (offset, change index). A
batch holding something the bulk way cannot take at all (`NotVectorisable`: a schema whose document form needs
another conversion, an image column of a type the text does not take, a column no schema declares, values all
without a schema block, whose texts are the records' own spelling) and every later batch of its range go record
by record. Settings that are not the plain path's (`vector_plan`) go record by record as well. Either way a
range is read as value chunks that keep their records: the record-by-record way builds a record's batch (its
headers) only where the rows keep its raw bytes (`ChangelogBatchDecoder.chunk`).

The rows hold what the bucket stage reads (`STAGE_FIELDS`) exactly as the record-by-record way gives them;
of the others, `snapshot` is left null (the bucket stage does not read it). An image's columns are written
in its schema's field order. With `typed`, the rows decoded in bulk also carry each image's columns typed
(`rows.names.TYPED_PREFIX`; the records decoded record by record carry none), so that the net rows are not
typed from their texts again (`materialize.payload`).
`tests/unit/service/kafka_to_delta/source/test_changelog_columns.py` holds the two ways equal.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.kafka.range_reader import ValueChunk
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder
from service.kafka_to_delta.formats.debezium_json import compact_json
from service.kafka_to_delta.rows.arrow import CHANGELOG_SCHEMA
from service.kafka_to_delta.rows.names import Column, KafkaColumn, typed_names
from service.kafka_to_delta.source.debezium_columns import RangeColumns
from service.kafka_to_delta.source.range_state import (
    GROUP_COLUMN,
    KEY_COLUMN,
    KIND,
    ROW_TEXT,
    SOURCE_COLUMNS,
    UNCHANGED_TEXT,
)
from service.kafka_to_delta.source.vector_plan import NotVectorisable, VectorPlan, vector_plan
from service.kafka_to_delta.source.wrapper_layouts import BARE

_FROM_TEXTS = {Column.KIND: KIND, Column.KEY: KEY_COLUMN, Column.UPSERT_KEY: KEY_COLUMN,
               Column.PARTITION_KEY: KEY_COLUMN, Column.ROW: ROW_TEXT, Column.UNCHANGED: UNCHANGED_TEXT}


class BulkChangelog:
    """The changelog rows of a pipeline's Kafka ranges (`range_decoder` per range). Picklable."""

    def __init__(self, decoder: ChangelogBatchDecoder, primary_key: tuple[str, ...] | None, typed: bool = False) -> None:
        """`primary_key` None: every batch record by record. `typed`: the rows decoded in bulk also carry their
        typed image columns (`TYPED_PREFIX`, `RangeColumns.with_typed`)."""
        self.decoder = decoder
        self.typed = typed
        self.plan: VectorPlan | None = None
        if primary_key is not None:
            self.plan = vector_plan(decoder, primary_key)

    def range_decoder(self) -> "RangeChangelog":
        """A decoder for the record batches of one range, in order."""
        return RangeChangelog(self.decoder, self.plan, self.typed)


class RangeChangelog:
    """One range's record batches (`RAW_SCHEMA`, one topic partition, in order) -> their changelog
    batches (`CHANGELOG_SCHEMA`). How it went: `applies` (the bulk way could take the range), `bulk` (batches
    that went the bulk way), `odd` (records of those decoded record by record), `fallback` (why the rest of
    the range went record by record)."""

    def __init__(self, decoder: ChangelogBatchDecoder, plan: VectorPlan | None, typed: bool = False) -> None:
        self.decoder = decoder
        self.columns = None if plan is None else RangeColumns(plan, decoder.decode_value, with_texts=True,
                                                               with_typed=typed)
        self.applies = plan is not None
        self.bulk = self.odd = 0
        self.fallback: str | None = None

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The changelog rows of one record batch of the range."""
        def odd(offsets: list[int]) -> pa.RecordBatch:
            return batch.filter(pc.is_in(batch.column(KafkaColumn.OFFSET), value_set=pa.array(offsets, pa.int64())))

        return self._decoded(lambda: ValueChunk.of_batch(batch), odd, lambda: self.decoder(batch))

    def chunk(self, chunk: ValueChunk) -> pa.RecordBatch:
        """The changelog rows of one value chunk of the range that kept its records (`read_values` with
        `keep_records`): the record batch of a record is only built where the record-by-record way needs its
        headers (`ChangelogBatchDecoder.chunk`)."""
        def odd(offsets: list[int]) -> pa.RecordBatch:
            return chunk.records(np.searchsorted(np.asarray(chunk.offsets, np.int64), offsets).tolist())

        return self._decoded(lambda: chunk, odd, lambda: self.decoder.chunk(chunk))

    def _decoded(self, values: Callable[[], ValueChunk], odd: Callable[[list[int]], pa.RecordBatch],
                 one_by_one: Callable[[], pa.RecordBatch]) -> pa.RecordBatch:
        """`values`: the chunk's values; `odd`: the records at some offsets; `one_by_one`: all of them decoded
        record by record."""
        if self.columns is not None:
            chunk = values()
            if not chunk.offsets:
                return _empty_batch()
            try:
                decoded = self._bulk(self.columns, chunk, odd)
            except NotVectorisable as exc:
                self.columns, self.fallback = None, str(exc)  # this batch and the rest of the range
            else:
                self.bulk += 1
                return decoded
        return one_by_one()

    def _bulk(self, columns: RangeColumns, chunk: ValueChunk, records: Callable[[list[int]], pa.RecordBatch]) -> pa.RecordBatch:
        seen = len(columns.odd)
        rows = columns.changelog_rows(chunk)
        odd = columns.odd[seen:]
        del columns.odd[seen:]
        self.odd += len(odd)
        parts = [] if rows is None else [self._laid_out(columns, rows)]
        if odd:
            parts.append(pa.Table.from_batches([self.decoder(records(odd))]))
        if not parts:
            return _empty_batch()
        joined = pa.concat_tables(parts, promote_options="default") if len(parts) > 1 else parts[0]
        if len(parts) > 1:
            joined = joined.sort_by([(Column.OFFSET, "ascending"), (Column.CHANGE_INDEX, "ascending")])
        return joined.combine_chunks().to_batches()[0] if joined.num_rows else _empty_batch()

    @staticmethod
    def _laid_out(columns: RangeColumns, rows: pa.Table) -> pa.Table:
        """The bulk way's rows as `CHANGELOG_SCHEMA`."""
        assert columns.layouts is not None
        groups = rows.column(GROUP_COLUMN)
        texts: list[Any] = []
        known = pc.unique(groups).to_pylist()
        for group in known:
            texts.append(None if group == BARE else compact_json(columns.layouts.known[group].types))
        types = pa.array(texts, pa.string()).take(pc.index_in(groups, value_set=pa.array(known, groups.type)))
        arrays = []
        for field in CHANGELOG_SCHEMA:
            if field.name in SOURCE_COLUMNS:
                array = rows.column(SOURCE_COLUMNS[field.name])
            elif field.name in _FROM_TEXTS:
                array = rows.column(_FROM_TEXTS[field.name])
            elif field.name == Column.TYPES:
                array = types
            else:
                array = pa.nulls(rows.num_rows, field.type)
            arrays.append(array.cast(field.type) if array.type != field.type else array)
        typed = typed_names(rows.column_names)
        schema = pa.schema([*CHANGELOG_SCHEMA, *(rows.schema.field(name) for name in typed)])
        return pa.Table.from_arrays(arrays + [rows.column(name) for name in typed], schema=schema)


def _empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=CHANGELOG_SCHEMA)
