"""The next micro-batch's feed rows, read while this one is encoded and published.

Spark plans a micro-batch only after the previous one returned, but where it will end is known
before that: the change-feed source's own planning (`ChangeFeedStreamReader.latestOffset`), run
in the driver on a reader of its own, gives the end Spark will give unless the table gained
versions in between. `ReadAhead` reads [where this batch ends, that end) in a thread (delta-rs
and Arrow release the GIL, so the read takes the core the encoder leaves) and hands the rows to
the next batch only when its range is exactly the one read; any other range is read as before.
Delta versions never change, so the rows read for a range are that range's rows.

One read at a time, and never at the same time as the pipeline's own read: a read ahead shares
the pipeline's `VersionRest`, so `take` waits for one under way before the batch reads.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import pyarrow as pa

from connectors.delta.feed_chunks import Offset

log = logging.getLogger(__name__)

Planned = tuple[Offset, Offset, pa.Table] | None


class ReadAhead:
    """Reads the batch after this one in the background (see the module docstring).

    `plan_end(begin)`: where the batch starting at `begin` will end (None or `begin`: nothing to read);
    `read(begin, end)`: the feed rows of [begin, end) as the pipeline reads them.
    """

    def __init__(self, plan_end: Callable[[Offset], Offset | None], read: Callable[[Offset, Offset], pa.Table],
                 name: str) -> None:
        self._plan_end = plan_end
        self._read = read
        self._name = name
        self._pending: Future[Planned] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self.used = 0  # batches whose rows were read ahead

    def start(self, begin: Offset) -> None:
        """Begin reading the batch that will start at `begin` (a read under way is dropped first)."""
        self.drop()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"read-ahead-{self._name}")
        self._pending = self._pool.submit(self._planned, begin)

    def _planned(self, begin: Offset) -> Planned:
        end = self._plan_end(begin)
        if end is None or end <= begin:
            return None
        return begin, end, self._read(begin, end)

    def take(self, start: Offset, end: Offset) -> pa.Table | None:
        """The rows of [start, end) if they were read ahead, else None (after waiting for a read under way)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        try:
            planned = pending.result()
        except Exception:  # noqa: BLE001 - the batch reads the range itself and raises what is wrong
            log.debug("export %s: reading ahead failed; the batch reads its rows itself", self._name, exc_info=True)
            return None
        if planned is None or planned[:2] != (start, end):
            log.debug("export %s: read ahead %s, the batch is [%s, %s)", self._name,
                      None if planned is None else planned[:2], start, end)
            return None
        self.used += 1
        return planned[2]

    def drop(self) -> None:
        """Discard a read under way or done (waits for it: it may be using the pipeline's reader state)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending.result()
            except Exception:  # noqa: BLE001 - nothing was going to use it
                pass

    def close(self) -> None:
        """Drop any read and stop the thread."""
        self.drop()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
