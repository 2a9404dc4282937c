"""Kafka: the Spark streaming source, admin helpers and the embedded local broker."""
