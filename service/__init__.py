"""cdc-lakehouse: Debezium-style change streams in Kafka into correct, current Delta tables."""

from service.runtime.allocators import apply_allocator_defaults

apply_allocator_defaults()  # before anything of the service loads pyarrow or deltalake
