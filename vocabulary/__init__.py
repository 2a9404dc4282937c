"""Words every layer shares, below both connectors/ and service/: change kinds, Debezium op codes, envelope field names, error roots, redaction."""
