"""Delta Lake adapters: arrow column types and table engines."""
