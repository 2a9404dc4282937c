"""Python workers' heaps frozen for the garbage collector at each task's start.

Spark's Python daemon runs a full `gc.collect()` in a reused worker after every task
(`pyspark/daemon.py`). A worker holds its imports (pyarrow, pandas, pyspark, confluent-kafka, the
decoders: about 120,000 tracked objects), so each of those collections walked them all: 52-60 ms in a
process holding just those imports, and 23 % of the Python workers' CPU in a materializer run (py-spy; the
real capture as Avro, batches of 10,000, four tasks a batch). `task_started`, called first by each task the
service runs in a worker (the data sources' `read`, the stateful processors' `init`, the `mapInArrow`
functions), freezes what is alive then (`gc.freeze`), so the collection after the task looks only at what
the task made. What is alive at a task's start is what the worker keeps between tasks: the collection
after the previous task took the rest. Every `FULL_EVERY` tasks the heap is unfrozen instead, and the
collection after that task looks at everything once: whatever was frozen and has since become cyclic
garbage is reclaimed then. Figures: docs/design/runtime-tuning.md.
"""

from __future__ import annotations

import gc

FULL_EVERY = 64
"""One task in this many leaves the whole heap to the collection after it."""

_started = 0


def task_started() -> None:
    """Freeze the worker's heap for the collection after this task (or, one task in `FULL_EVERY`, unfreeze it)."""
    global _started
    _started += 1
    if _started % FULL_EVERY == 0:
        gc.unfreeze()
    else:
        gc.freeze()
