"""Adapters to external systems (Kafka, Delta, Schema Registry); no CDC semantics here."""
