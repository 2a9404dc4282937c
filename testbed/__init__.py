"""What tests and benchmarks share: generated inputs (fuzzed records, Avro workloads), their accounting, and a local standalone Spark cluster."""
