"""A database source as one streaming query: every table's net changes, one MERGE per table."""
