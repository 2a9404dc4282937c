"""A database micro-batch's payloads kept in the checkpoint until every table has committed them.

With `overlap_merges` the query hands a batch's MERGEs to a thread and lets Spark go on to the next
batch (whose read then runs beside them), so Spark records the batch as done before its tables hold
it. The payloads are written here first, one Arrow IPC file per batch (atomically, synced), and
removed once every table committed the batch. After a crash, the next micro-batch commits what is
still here first, each table skipping what it already holds (its application id and the batch id):
nothing is lost and nothing is applied twice.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pyarrow as pa

FOLDER = "staged"
_NAME = re.compile(r"^(\d{20})\.arrow$")


class StagedBatches:
    """The staged batches of one database query (`<checkpoint>/staged/<batch id>.arrow`)."""

    def __init__(self, checkpoint: str) -> None:
        self.folder = Path(checkpoint.rstrip("/")) / FOLDER

    def _path(self, batch_id: int) -> Path:
        return self.folder / f"{int(batch_id):020d}.arrow"

    def write(self, batch_id: int, payloads: pa.Table) -> None:
        """Keep the batch's payloads (replacing any earlier copy), synced before this returns."""
        self.folder.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.folder, prefix=".staging-")
        try:
            with os.fdopen(handle, "wb") as out:
                with pa.ipc.new_file(out, payloads.schema) as writer:
                    writer.write_table(payloads)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self._path(batch_id))
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        directory = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def pending(self) -> list[int]:
        """The staged batch ids, oldest first."""
        if not self.folder.is_dir():
            return []
        return sorted(int(m.group(1)) for m in map(_NAME.match, os.listdir(self.folder)) if m)

    def read(self, batch_id: int) -> pa.Table:
        with pa.OSFile(str(self._path(batch_id)), "rb") as source:
            return pa.ipc.open_file(source).read_all()

    def remove(self, batch_id: int) -> None:
        self._path(batch_id).unlink(missing_ok=True)
