"""The next micro-batch's feed rows, read while this one is encoded and published, and its first
runs of records encoded while this one's transaction commits.

Spark plans a micro-batch only after the previous one returned, but where it will end is known
before that: the change-feed source's own planning (`ChangeFeedStreamReader.latestOffset`), run
in the driver on a reader of its own, gives the end Spark will give unless the table gained
versions in between. `ReadAhead` reads [where this batch ends, that end) in a thread (delta-rs
and Arrow release the GIL, so the read takes the core the encoder leaves) and hands the rows to
the next batch only when its range is exactly the one read; any other range is read as before.
Delta versions never change, so the rows read for a range are that range's rows.

With an `encode` function (an export whose encoder keeps no state), the thread then waits until
this batch's records are all handed to the producer (`go`) and encodes the next batch's first
runs, at most `runs` of them, while the producer waits for the Kafka commit and Spark plans the
next batch: the driver's Python is idle then. It stops at the next `take` (after the run under
way), which hands the runs over with the rows; the batch encodes the rest. A start told to encode
until taken (`bound=False`: the first batch of a new query, while Spark starts the query, which
takes longer than encoding a whole batch) is not held to `runs`. The encoder is used by
one thread at a time: the batch's own encoding is over before `go`, and `take` waits. `encode`
returns None when the encoder holds state at that moment; runs encoded ahead and then not used
(another range, a failure, `drop`) are followed by `undo`, which gives the encoder back the empty
state it had before them.

One read at a time, and never at the same time as the pipeline's own read: a read ahead shares
the pipeline's `VersionRest`, so `take` waits for one under way before the batch reads.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pyarrow as pa

from connectors.delta.feed_chunks import Offset

log = logging.getLogger(__name__)

AHEAD_RUNS = 4
"""Runs of records encoded ahead at most (a run is `export_encoder.SLICE_CHANGES` changes): about what
the wait for a Kafka commit and Spark's planning of the next batch leave time for, a few MB each."""


@dataclass
class EncodedAhead:
    """A batch's first runs of records, encoded before the batch began, and the rest still to encode."""

    runs: list[list[Any]] = field(default_factory=list)
    rest: Iterator[list[Any]] = field(default_factory=lambda: iter(()))


@dataclass
class Ahead:
    """What a batch takes over: its rows, and, when encoded ahead, its first runs of records."""

    rows: pa.Table
    encoded: EncodedAhead | None = None


Planned = tuple[Offset, Offset, Ahead] | None


class ReadAhead:
    """Reads the batch after this one in the background (see the module docstring).

    `plan_end(begin)`: where the batch starting at `begin` will end (None or `begin`: nothing to read);
    `read(begin, end)`: the feed rows of [begin, end) as the pipeline reads them; `encode(rows)`:
    the records of those rows, a run at a time, or None when they cannot be encoded ahead now
    (`encode` None: nothing is ever encoded ahead); `undo()`: forget what encoding ahead did to the
    encoder, when its runs are not used.
    """

    def __init__(self, plan_end: Callable[[Offset], Offset | None], read: Callable[[Offset, Offset], pa.Table],
                 name: str, encode: Callable[[pa.Table], Iterator[list[Any]] | None] | None = None,
                 undo: Callable[[], None] = lambda: None, runs: int = AHEAD_RUNS) -> None:
        self._plan_end = plan_end
        self._read = read
        self._name = name
        self._encode = encode
        self._undo = undo
        self._runs = runs
        self._pending: Future[Planned] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._go = threading.Event()
        self._stop = threading.Event()
        self.used = 0  # batches whose rows were read ahead

    def start(self, begin: Offset, bound: bool = True) -> None:
        """Begin reading the batch that will start at `begin` (a read under way is dropped first);
        `bound` False: encode its runs until `take`, not only the first `runs`."""
        self.drop()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"read-ahead-{self._name}")
        self._go.clear()
        self._stop.clear()
        self._pending = self._pool.submit(self._planned, begin, self._runs if bound else None)

    def go(self) -> None:
        """This batch's records are all encoded: the thread may encode the next batch's first runs."""
        self._go.set()

    def _planned(self, begin: Offset, runs: int | None) -> Planned:
        end = self._plan_end(begin)
        if end is None or end <= begin:
            return None
        ahead = Ahead(self._read(begin, end))
        if self._encode is not None:
            self._go.wait()
            if not self._stop.is_set():
                ahead.encoded = self._encoded(ahead.rows, runs)
        return begin, end, ahead

    def _encoded(self, rows: pa.Table, runs: int | None) -> EncodedAhead | None:
        """The first `runs` runs of `rows` (None: until `take`), or None when they cannot be encoded ahead."""
        try:
            rest = self._encode(rows)  # type: ignore[misc]
            if rest is None:
                return None
            encoded = EncodedAhead(rest=rest)
            while (runs is None or len(encoded.runs) < runs) and not self._stop.is_set():
                run = next(encoded.rest, None)
                if run is None:
                    break
                encoded.runs.append(run)
        except Exception:  # noqa: BLE001 - the batch encodes its rows itself and raises what is wrong
            log.debug("export %s: encoding ahead failed; the batch encodes its rows itself", self._name,
                      exc_info=True)
            self._undo()
            return None
        return encoded

    def take(self, start: Offset, end: Offset) -> Ahead | None:
        """The rows of [start, end) (and runs encoded ahead) if they were read ahead, else None (after
        waiting for a read, or the run being encoded, under way)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        self._stop.set()
        self._go.set()
        try:
            planned = pending.result()
        except Exception:  # noqa: BLE001 - the batch reads the range itself and raises what is wrong
            log.debug("export %s: reading ahead failed; the batch reads its rows itself", self._name, exc_info=True)
            return None
        if planned is None or planned[:2] != (start, end):
            log.debug("export %s: read ahead %s, the batch is [%s, %s)", self._name,
                      None if planned is None else planned[:2], start, end)
            self._discard(planned)
            return None
        self.used += 1
        return planned[2]

    def _discard(self, planned: Planned) -> None:
        if planned is not None and planned[2].encoded is not None:
            self._undo()

    def drop(self) -> None:
        """Discard a read under way or done (waits for it: it may be using the pipeline's reader state)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._stop.set()
            self._go.set()
            try:
                self._discard(pending.result())
            except Exception:  # noqa: BLE001 - nothing was going to use it
                pass

    def close(self) -> None:
        """Drop any read and stop the thread."""
        self.drop()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
