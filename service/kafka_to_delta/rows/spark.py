"""The Spark schemas of the rows that cross the ingest stages: changelog rows, the decoded stream, net changes."""

from __future__ import annotations

from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from service.kafka_to_delta.rows.arrow import CHANGELOG_SCHEMA, STREAM_SCHEMA
from service.kafka_to_delta.rows.names import CHANGES_COLUMN, EARLIER_IMAGES

CHANGELOG_SPARK_SCHEMA = from_arrow_schema(CHANGELOG_SCHEMA)
_STREAM_SPARK_SCHEMA = from_arrow_schema(STREAM_SCHEMA)
STREAM_SPARK_SCHEMA = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in _STREAM_SPARK_SCHEMA.fields)
"""The changelog rows plus their watermark candidate, as a schema string for a data source."""

NET_SCHEMA = StructType(
    [
        StructField("key", StringType()),
        StructField("kind", StringType()),
        StructField("row", StringType()),
        StructField("types", StringType()),
        StructField("unchanged", StringType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", LongType()),
        StructField(CHANGES_COLUMN, LongType()),
        StructField("error", StringType()),
        StructField("handling", StringType()),
        StructField("stage", StringType()),
        StructField("raw_key", BinaryType()),
        StructField("raw_value", BinaryType()),
        StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                      StructField("value", BinaryType())]))),
        StructField("conflicts", LongType()),
        StructField("rollbacks", LongType()),
        StructField("stale_dropped", LongType()),
        StructField("cleared_state_warnings", LongType()),
        StructField("state_bytes", LongType()),
        StructField(EARLIER_IMAGES, ArrayType(StructType([StructField("row", StringType()),
                                                           StructField("unchanged", StringType())]))),
    ]
)
"""Net changes (kind +U upsert or -D delete; null kind for error rows and counter-only rows).

Both the per-batch reduction (`materialize.net_changes`) and the materializer produce them."""

NET_ARROW_SCHEMA = to_arrow_schema(NET_SCHEMA)
