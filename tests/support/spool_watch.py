"""What the driver is given from a payload spool (`rows.payload_spool`) during a run: the files handed over,
what the spool held when each was read, whether each payload was uncompressed."""

from __future__ import annotations

import os

import pyarrow as pa

from service.kafka_to_delta.rows.ipc import ipc_bytes
from service.kafka_to_delta.rows.payload_spool import MARK
from service.kafka_to_delta.source import batch_changes


class SpoolWatch:
    """Installed over `batch_changes.resolved` (with pytest's `monkeypatch`) before the run."""

    def __init__(self, monkeypatch) -> None:
        self.handed: list[str] = []
        self.left_behind: list[list[str]] = []
        self.uncompressed: list[bool] = []
        self._real = batch_changes.resolved
        monkeypatch.setattr(batch_changes, "resolved", self._observed)

    def _observed(self, payload: bytes):
        data = payload
        if payload.startswith(MARK):
            self.handed.append(payload[len(MARK):].decode())
            self.left_behind.append(os.listdir(os.path.dirname(self.handed[-1])))
            with open(self.handed[-1], "rb") as file:
                data = file.read()
        self.uncompressed.append(data == ipc_bytes(pa.ipc.open_stream(data).read_all(), compressed=False))
        return self._real(payload)

    def check(self, batch_files: int) -> None:
        """Every payload came in a file of one spool, uncompressed; each batch's files were gone after it (never
        more than `batch_files` at once) and the spool after the query."""
        assert self.handed, "no payload was handed over in a file"
        assert all(self.uncompressed), "a payload handed over in a file was compressed (it never crosses the JVM)"
        spool = os.path.dirname(self.handed[0])
        assert all(os.path.dirname(path) == spool for path in self.handed)
        assert all(not os.path.exists(path) for path in self.handed)  # each batch's files removed once read
        assert max(len(files) for files in self.left_behind) <= batch_files
        assert not os.path.exists(spool)  # the query stopped: its spool is gone
