"""Housekeeping of Spark checkpoints before a query starts.

Spark writes each offset-log and commit-log entry to a hidden temporary file and renames it into
place. A process killed between the two (SIGKILL, power loss) leaves the temporary file behind.
Spark ignores such leftovers except on batch 0: a query whose `offsets/` directory holds anything
at all refuses to start ("should be empty on batch 0"), so one kill during a query's very first
batch would stop the service for good. No query runs on the checkpoint while this runs (one
service per checkpoint), so every such leftover is an abandoned write and is removed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

log = logging.getLogger(__name__)
_LOGS = ("offsets", "commits")
# Spark's temporary names: ".<batch>.<uuid>.tmp" and their checksum files ("..<batch>.<uuid>.tmp.crc").
_ABANDONED = re.compile(r"^\.+\d+\.[0-9a-f-]+\.tmp(\.crc)?$")


def local_path(location: str) -> Path | None:
    """The local directory of a checkpoint location; None on an object store."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else location)
    return None  # object stores: renames there are not how Spark commits a log entry


def remove_abandoned_writes(checkpoint: str) -> list[str]:
    """Remove temporary files of log entries a killed process never renamed; returns their names."""
    root = local_path(checkpoint)
    removed: list[str] = []
    if root is None:
        return removed
    for name in _LOGS:
        directory = root / name
        if not directory.is_dir():
            continue
        for entry in directory.iterdir():
            if entry.is_file() and _ABANDONED.match(entry.name):
                entry.unlink()
                removed.append(f"{name}/{entry.name}")
    if removed:
        log.warning("checkpoint %s: removed %d abandoned write(s) of a killed run: %s",
                    checkpoint, len(removed), ", ".join(sorted(removed)))
    return removed


def batch_start_offsets(checkpoint: str, batch_id: int) -> dict | None:
    """The source offsets a micro-batch started from (its predecessor's end in the offset log, for a
    query with one source); None for the first batch or a checkpoint this process cannot read."""
    folder = local_path(checkpoint)
    if folder is None or batch_id <= 0:
        return None
    entry = folder / "offsets" / str(batch_id - 1)
    try:
        lines = entry.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None
    return json.loads(lines[2]) if len(lines) > 2 and lines[2] not in ("", "-") else None


def write_json(path: Path, document: Any) -> None:
    """Replace the file at `path` with `document` as JSON, atomically: a reader in another process
    never sees half a file. Its folder is made when missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        json.dump(document, out, indent=1, sort_keys=True)
    os.replace(temporary, path)
