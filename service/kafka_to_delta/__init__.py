"""Kafka -> Delta: decode Debezium changes, materialize them, merge them into Delta tables."""
