"""The two inputs of a join read by one streaming query: split its Kafka records by input and
decode each side with its own decoder (the ingest decoders: format and FROM_CHANGELOG block).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from connectors.kafka.range_reader import RAW_SCHEMA
from service.config.joins import JoinInput
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder
from service.kafka_to_delta.rows.arrow import CHANGELOG_SCHEMA
from service.kafka_to_delta.source.decode_stage import value_decoder


def input_decoder(side: JoinInput) -> ChangelogBatchDecoder:
    """The picklable decoder of one join input (its format and FROM_CHANGELOG settings)."""
    return ChangelogBatchDecoder(side.from_changelog, side.primary_key, side.primary_key,
                                 value_decoder=value_decoder(side.format, side.schema_registry))


def side_records(raw: pa.Table, side: JoinInput) -> pa.Table:
    """The Kafka records (`RAW_SCHEMA`) of one input, in source order (topic, partition, offset)."""
    mine = raw.filter(pc.is_in(raw.column("topic"), pa.array(list(side.topics), pa.string())))
    return mine.sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")])


def decode_records(records: pa.Table, decoder: ChangelogBatchDecoder) -> pa.Table:
    """Changelog rows (`CHANGELOG_SCHEMA`) of Kafka records (`RAW_SCHEMA`), in source order."""
    records = records.select(RAW_SCHEMA.names).cast(RAW_SCHEMA)
    batches = [decoder(batch) for batch in records.to_batches() if batch.num_rows]
    return pa.Table.from_batches(batches, schema=CHANGELOG_SCHEMA)
