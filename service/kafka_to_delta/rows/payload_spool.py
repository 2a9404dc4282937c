"""Payloads handed from the Python workers to the driver through files, where both run on one machine.

On the plain path (and a database source's, `source.database_ranges`) each Kafka range's payload (Arrow
IPC, `rows.ipc`) is one binary cell of the source's rows, and the JVM copies it on its way to the driver's
`toArrow`: read from the worker's socket into an Arrow batch, into rows, back into Arrow, into a task
result and the block manager, then to the driver's Python. That costs the JVM about a core-second per
steady batch of a wide table's capture (100,000 records, 16 MB of payloads) next to the Python workers'
1.2 s of reading and decoding (docs/design/ingest-data-path.md, "Payloads handed over in files"). On a
local master the workers and the driver share the filesystem, so the reducer writes each payload's IPC
stream straight into a file of the pipeline's spool (`written`, uncompressed) and the cell holds the
file's reference (`MARK` and its path); the driver maps the file (`resolved`). A write that fails hands
the payload inline, as on a cluster, where there is no spool.

The spool is emptied after each batch's payloads are read (`clear`): a query runs one batch at a time,
so what is left then was written by a task attempt that failed (a payload read before keeps its mapped
pages). A spool is per process and pipeline; one left by a process that is gone is removed by the next
one that opens a spool.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

MARK = b"cdc-lakehouse-spool:"
"""What starts a handed payload's cell (an Arrow IPC stream starts with 0xFFFFFFFF)."""

_ROOT = "cdc-lakehouse-spool"
_OWNER = re.compile(r"^(\d+)-")


@dataclass(frozen=True)
class PayloadSpool:
    """One pipeline's spool directory (pickled to the workers)."""

    directory: str

    def written(self, table: "pa.Table") -> bytes | None:
        """`table` written as an uncompressed Arrow IPC stream into a new file of the spool, straight from its
        buffers; its reference, or None when the write fails (what it wrote of the file removed: a full
        disk keeps no partial payload)."""
        import pyarrow as pa  # not in the processes that only plan a source's reads

        from service.kafka_to_delta.rows.ipc import write_stream

        path = os.path.join(self.directory, uuid.uuid4().hex)
        try:
            with pa.OSFile(path, "wb") as file:
                write_stream(table, file, compressed=False)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(path)
            return None
        return MARK + path.encode()

    def clear(self) -> None:
        """Remove every file of the spool (after a batch's payloads were read)."""
        with os.scandir(self.directory) as entries:
            for entry in entries:
                try:
                    os.unlink(entry.path)
                except FileNotFoundError:
                    pass

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def resolved(payload: bytes) -> "bytes | pa.NativeFile":
    """A payload cell's IPC stream: its file mapped when it was handed over in one (the tables read from it
    keep the mapping, also once the spool is cleared)."""
    if not payload.startswith(MARK):
        return payload
    import pyarrow as pa

    return pa.memory_map(payload[len(MARK):].decode())


def payload_spool(master: str, pipeline_name: str, root: str | None = None) -> PayloadSpool | None:
    """A new spool for a pipeline on a local master (None elsewhere: the workers are other machines; and
    where no directory can be made there, a read-only filesystem: the payloads then go inline)."""
    if not master.startswith("local"):
        return None
    parent = Path(root or tempfile.gettempdir()) / _ROOT
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", pipeline_name)
    try:
        parent.mkdir(parents=True, exist_ok=True)
        _remove_orphans(parent)
        return PayloadSpool(tempfile.mkdtemp(prefix=f"{os.getpid()}-{name}-", dir=parent))
    except OSError:
        return None


def _remove_orphans(parent: Path) -> None:
    """Spools of processes that are gone."""
    for spool in parent.iterdir():
        owner = _OWNER.match(spool.name)
        if owner is not None and not _alive(int(owner.group(1))):
            shutil.rmtree(spool, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether process `pid` exists (another user's process, which may not be signalled, included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
