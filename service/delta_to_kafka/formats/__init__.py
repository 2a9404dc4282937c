"""Output formats: record layouts of an export (JSON envelopes built column by column, Avro in the Confluent wire format)."""
