"""The row formats that cross the ingest stages, defined once, below the stages.

- `names`: column names and schema strings, free of Arrow and Spark (the processes that only plan a
  query name the payload schema without loading the decoders);
- `arrow`: the Arrow schemas of changelog rows and plain-path payloads;
- `spark`: the Spark schemas of changelog rows, the decoded stream and net changes;
- `ipc`: Arrow tables as one binary value, for what crosses the JVM as a single cell.
"""
