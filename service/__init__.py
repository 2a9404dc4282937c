"""cdc-lakehouse: Debezium-style change streams in Kafka into correct, current Delta tables."""

import os

# delta-rs carries its own jemalloc, which keeps freed pages for 10 s by default (out of reach of
# `malloc_trim`) and then only marks them reclaimable (still resident): after a MERGE the driver stayed
# ~50 MiB above its working set through the next micro-batch. Freed pages now go back within about a
# second: driver 285-306 MiB during the 300,000-event benchmark's second batch -> 287 falling to 241 in
# 0.6 s; peak RSS of the process tree 1,510-1,583 -> 1,504-1,520 MiB (four and two runs). Giving them
# back at once (decay 0) cost more than it saved: the next MERGE faulted its pages in again, 0.12 ->
# 0.28 s per batch of 100,000 on a table of 200,000 keys; with one second that is 0.12 -> 0.14 s.
# This must be set before deltalake is loaded; an operator's own setting wins.
os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:1000,muzzy_decay_ms:0")

# Arrow's own allocator (jemalloc) keeps what a micro-batch freed; the C library's gives it back at
# `malloc_trim` (`service.runtime.memory_release`). The local Spark processes inherit the setting. 300,000
# envelopes, `run --until-idle`: peak RSS of the process tree 1,594-1,606 -> 1,459-1,484 MiB (each decode
# worker 277 -> 211 MiB at the peak), steady batch of 100,000 unchanged (0.56-0.67 s). The cost is on a
# large first batch: 1,000,000 envelopes (a first batch of 200,000 records) reached their first commit
# in 9.0-12.2 s against 6.7-7.2 s, wall 15.7-19.2 s against 13.1-14.1 s (two A/B pairs). Executors of a
# cluster take it from `spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL`. Set before pyarrow is loaded; an
# operator's own setting wins (`jemalloc` for the faster first batch).
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
