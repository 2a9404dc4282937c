"""Hand freed memory back to the system between micro-batches.

Arrow's memory pool keeps freed blocks for reuse, and glibc keeps freed heap (the Kafka
client's fetch buffers) until trimmed; in a long-running process both show up as resident
memory that no batch is using. (delta-rs's MERGE memory is in its own jemalloc, which
`allocators` configures to give freed pages back within a second.)

It runs at two points, one per process kind: on the driver after every micro-batch of every
supervised pipeline (`service.supervisor.batch_pipeline.BatchPipeline.process_batch`), and in a
Python worker after each Kafka range it read (`service.kafka_to_delta.source.changes_source`).
Figures: docs/design/runtime-tuning.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_LIBC = ctypes.util.find_library("c")


def release_memory() -> None:
    """Release Arrow's unused pool memory and trim the C heap (glibc only; elsewhere a no-op)."""
    import pyarrow as pa  # imported here: the planning processes that import this module never read data

    pa.default_memory_pool().release_unused()
    if _LIBC:
        trim = getattr(ctypes.CDLL(_LIBC), "malloc_trim", None)
        if trim is not None:
            trim(0)
