"""Input formats: bytes -> documents (Debezium / flat JSON, the Kafka Connect wrapper) and their row typing; Avro lives in connectors/schema_registry."""
