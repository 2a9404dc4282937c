"""The shape of what a Kafka range sends to the driver on the plain path (`partition_changes`).

Kept apart, and free of Arrow, so the Spark processes that only plan a query (source creation,
read planning, the streaming source runner) can name the schema without loading the decoders.
"""

PAYLOAD_SPARK_SCHEMA = "part string, payload binary"
PAYLOAD_COLUMN = "payload"
"""The column of `PAYLOAD_SPARK_SCHEMA` holding the Arrow IPC values."""
