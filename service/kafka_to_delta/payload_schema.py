"""The shape of what a Kafka range sends to the driver on the plain path (`partition_changes`).

Kept apart so the Spark processes that only plan a query (source creation, read planning, the
streaming source runner) can name the schema without importing the decoders.
"""

import pyarrow as pa

PAYLOAD_SCHEMA = pa.schema([("part", pa.string()), ("payload", pa.binary())])
PAYLOAD_SPARK_SCHEMA = "part string, payload binary"
