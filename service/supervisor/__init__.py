"""The supervisor: runs every configured pipeline as a streaming query in one Spark session, tells terminal from transient failures."""
