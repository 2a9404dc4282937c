"""cdc-lakehouse: Debezium-style change streams in Kafka into correct, current Delta tables."""
