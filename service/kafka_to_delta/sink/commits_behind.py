"""A micro-batch's Delta commit run behind the stages of the next one, its changes written ahead first.

The driver's part of a micro-batch (the MERGE of its net changes into the Delta table) runs on one core
while the other waits: Spark starts the next micro-batch only when `foreachBatch` returns. Here the batch's
changes are written ahead into its checkpoint (`<checkpoint>/changes_ahead/<batch id>.arrow`, an Arrow IPC
file: the typed changes, the Delta application id and whether the batch truncates; written to a temporary
name, synced and renamed into place) and the commit is handed to one background thread; `foreachBatch`
returns, Spark commits the batch's offsets and state, and the next batch's stages run while the commit does.

- Commits stay in batch order: a batch's commit is handed over only after the previous one ended, and a
  failed commit is raised there, and handed to `on_failure` when it happens (kept for the runner).
- The changes written ahead may be the ranges' rows not yet joined into net changes (`WrittenAhead.unjoined`,
  with the TRUNCATEs read): the join then runs in the commit, off the next micro-batch's way, and a replay
  joins them the same way.
- The file is removed once its commit is in Delta. A process that died with a file left commits it when the
  pipeline starts again (`replay`), before its query starts: the Delta transaction (application id, batch
  id) makes a commit that was in fact done a no-op. A batch Spark runs again (its end was never committed)
  finds its commit in Delta and is skipped, as without this.
"""

from __future__ import annotations

import logging
import json
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.ipc as ipc

log = logging.getLogger(__name__)

FOLDER = "changes_ahead"
_APP_ID, _TRUNCATE = b"cdc-lakehouse.app_id", b"cdc-lakehouse.truncate"
_UNJOINED = b"cdc-lakehouse.unjoined"
"""Written ahead by a version that leaves the join to the commit: the TRUNCATEs read, as JSON."""


@dataclass(frozen=True)
class WrittenAhead:
    """One micro-batch's changes as written ahead of its commit."""

    batch_id: int
    app_id: str
    changes: pa.Table
    truncate: bool
    unjoined: tuple[tuple[str, int, int], ...] | None = None
    """None: `changes` are the batch's net changes. Otherwise they are its ranges' rows, to be joined, and
    these the TRUNCATEs read among them (topic, partition, offset)."""


def write_ahead(folder: Path, batch: WrittenAhead) -> Path:
    """Write `batch` durably into `folder` (renamed into place after a sync); returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{batch.batch_id}.arrow"
    temporary = folder / f".{batch.batch_id}.arrow.tmp"
    metadata = {**(batch.changes.schema.metadata or {}), _APP_ID: batch.app_id.encode(),
                _TRUNCATE: b"1" if batch.truncate else b"0"}
    if batch.unjoined is not None:
        metadata[_UNJOINED] = json.dumps(batch.unjoined).encode()
    changes = batch.changes.replace_schema_metadata(metadata)
    with open(temporary, "wb") as sink:
        with ipc.new_file(sink, changes.schema) as writer:
            writer.write_table(changes)
        sink.flush()
        os.fsync(sink.fileno())
    os.replace(temporary, path)
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return path


def written_ahead(folder: Path) -> Iterator[WrittenAhead]:
    """The batches written ahead in `folder` and not yet removed, in batch order (temporary files of a write
    that never finished are removed: their batch's end was never committed by Spark, which runs it again)."""
    if not folder.is_dir():
        return
    for leftover in folder.glob(".*.arrow.tmp"):
        leftover.unlink()
    for path in sorted(folder.glob("*.arrow"), key=lambda p: int(p.stem)):
        with pa.memory_map(str(path)) as source:
            table = ipc.open_file(source).read_all()
        metadata = table.schema.metadata or {}
        rest = {k: v for k, v in metadata.items() if k not in (_APP_ID, _TRUNCATE, _UNJOINED)}
        unjoined = None
        if _UNJOINED in metadata:
            unjoined = tuple((str(topic), int(partition), int(offset))
                             for topic, partition, offset in json.loads(metadata[_UNJOINED]))
        yield WrittenAhead(int(path.stem), metadata[_APP_ID].decode(), table.replace_schema_metadata(rest or None),
                           metadata.get(_TRUNCATE) == b"1", unjoined)


class CommitsBehind:
    """One pipeline's commits behind its micro-batches (see the module): `hand_over` one batch's commit,
    `wait` for the one in flight."""

    def __init__(self, folder: Path, name: str, on_failure: Callable[[BaseException], None]) -> None:
        self.folder, self.name, self.on_failure = folder, name, on_failure
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"commit-{name}")
        self._pending: Future | None = None
        self._lock = threading.Lock()

    def hand_over(self, batch: WrittenAhead, commit: Callable[[], None]) -> None:
        """Write `batch` ahead and run `commit` (which commits exactly it) in the background, after the
        previous commit (raised here if it failed)."""
        self.wait()
        path = write_ahead(self.folder, batch)

        def run() -> None:
            try:
                commit()
            except BaseException as error:
                log.error("pipeline %s: the commit of batch %d failed; its changes stay written ahead in %s",
                          self.name, batch.batch_id, path)
                self.on_failure(error)
                raise
            path.unlink()

        with self._lock:
            self._pending = self._thread.submit(run)

    def wait(self) -> None:
        """Wait for the commit in flight (if any); raise its failure (once)."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Wait for the commit in flight (its failure is not raised) and end the thread."""
        self.settle()
        self._thread.shutdown(wait=True)

    def settle(self) -> BaseException | None:
        """`wait`, the failure returned instead of raised."""
        try:
            self.wait()
        except BaseException as error:
            return error
        return None


def replay(folder: Path, name: str, commit: Callable[[WrittenAhead], None]) -> int:
    """Commit every batch written ahead in `folder` and not known to be in Delta (`commit` skips a batch the
    table holds), in batch order, removing each file after; returns how many there were."""
    count = 0
    for batch in written_ahead(folder):
        log.warning("pipeline %s: batch %d was written ahead but its commit not known done: committing it now",
                    name, batch.batch_id)
        commit(batch)
        (folder / f"{batch.batch_id}.arrow").unlink()
        count += 1
    return count
