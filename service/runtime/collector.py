"""Python's cyclic garbage collector paused while a burst of acyclic values is built.

The collector runs after every 700 new containers and, in the older generations, traverses every
object still alive: decoding a batch of records builds thousands of dicts, lists and tuples that
stay alive until the batch's output is made, so each collection rescans the batch so far (and every
module the process imported). Those values hold no reference cycles, so reference counting frees
them; the collector is paused for the burst only and runs again as before once it ends (a cycle
made inside the burst, such as an exception's traceback, is collected then).

Where it applies (docs/design/runtime-tuning.md, "collector paused"): the record-by-record decode of
a Kafka batch (`ChangelogBatchDecoder`), and the export's records built from Arrow columns
(`columnar_records`).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection inside the block; the collector's own state is restored after it
    (an outer pause stays a pause)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
