"""The Arrow schemas of the rows that cross the ingest stages: changelog rows and plain-path payloads."""

from __future__ import annotations

import pyarrow as pa

from service.kafka_to_delta.rows.names import PAYLOAD_COLUMN, WATERMARK_COLUMN, Column, typed_names

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
COMPUTED_FIELDS = [
    pa.field(Column.CHANGE_INDEX, pa.int32()),
    pa.field(Column.KIND, pa.string()),
    pa.field(Column.KEY, pa.string()),
    pa.field(Column.UPSERT_KEY, pa.string()),
    pa.field(Column.PARTITION_KEY, pa.string()),
    pa.field(Column.ROW, pa.string()),
    pa.field(Column.TYPES, pa.string()),
    pa.field(Column.UNCHANGED, pa.string()),
    pa.field(Column.INTENT, pa.string()),
    pa.field(Column.SNAPSHOT, pa.string()),
    pa.field(Column.SEQUENCE, pa.string()),
    pa.field(Column.EVENT_TIME, pa.int64()),
    pa.field(Column.ERROR, pa.string()),
    pa.field(Column.HANDLING, pa.string()),
    pa.field(Column.STAGE, pa.string()),
]
"""The columns of `CHANGELOG_SCHEMA` that FROM_CHANGELOG computes (the others come from the record)."""
CHANGELOG_SCHEMA = pa.schema(
    [
        pa.field(Column.TOPIC, pa.string()),
        pa.field(Column.PARTITION, pa.int32()),
        pa.field(Column.OFFSET, pa.int64()),
        *COMPUTED_FIELDS[:1],
        pa.field(Column.TIMESTAMP, pa.int64()),
        *COMPUTED_FIELDS[1:],
        pa.field(Column.RAW_KEY, pa.binary()),
        pa.field(Column.RAW_VALUE, pa.binary()),
        pa.field(Column.HEADERS, HEADERS_TYPE),
    ]
)
"""One row per changelog row, or per record that could not be converted (`error` set).

Source order is (topic, partition, offset, change_index); `timestamp` is the Kafka record's,
epoch ms. `kind` is '+I', '-U', '+U', '-D' or 'TRUNCATE'; `row`, `types` (column -> type
name), `unchanged` and `sequence` are JSON text; `intent` is set when the stateful stage
decides the kind. Error rows: `error`, `handling` ('FAIL', 'LOG', 'SKIP', 'DEAD_LETTER'),
`stage` ('decode', 'from_changelog') and the original `raw_key`, `raw_value`, `headers`.
"""

STREAM_SCHEMA = CHANGELOG_SCHEMA.append(pa.field(WATERMARK_COLUMN, pa.int64()))
"""The changelog rows plus their watermark candidate (`source.decode_stage`)."""

PAYLOAD_SCHEMA = pa.schema([("part", pa.string()), (PAYLOAD_COLUMN, pa.binary())])
"""`names.PAYLOAD_SPARK_SCHEMA` in Arrow."""


def joined_tables(tables: list[pa.Table], promote_options: str) -> pa.Table:
    """`pa.concat_tables`; where the tables' typed image columns (`names.TYPED_PREFIX`) do not join (two
    schema versions typed a column differently), the tables without them (their rows are then typed from
    their texts)."""
    if len(tables) == 1:
        return tables[0]
    try:
        return pa.concat_tables(tables, promote_options=promote_options)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        if not any(typed_names(table.column_names) for table in tables):
            raise
    return pa.concat_tables([table.drop_columns(typed_names(table.column_names)) for table in tables],
                            promote_options=promote_options)
