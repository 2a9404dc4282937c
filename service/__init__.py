"""cdc-lakehouse: Debezium-style change streams in Kafka into correct, current Delta tables."""

import os

# delta-rs carries its own jemalloc, which keeps freed pages for 10 s by default, out of reach of
# `malloc_trim`: after a MERGE the driver stayed ~50 MiB above its working set through the next
# micro-batch. Handing freed pages back at once: driver 285-306 -> 232-241 MiB during the 300,000-event
# benchmark's second batch, peak RSS of the process tree 1,510-1,583 -> 1,496-1,510 MiB (four runs
# each); the cost is page faults when the next MERGE grows again, 0.11-0.14 -> 0.16-0.20 s for a MERGE
# of 100,000 keys. This must be set before deltalake is loaded; an operator's own setting wins.
os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0")
