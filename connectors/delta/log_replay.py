"""The live data files of a local Delta table as its log lists them: path, deletion vector, statistics.

delta-rs's Python API lists a snapshot's files (`get_add_actions`) without their deletion vectors or
statistics text, both of which a commit that adds a deletion vector to a file must repeat (its
`remove` names the file's current vector, its `add` the file's statistics). This reads them from the
log: the last checkpoint (a classic one, single or multi-part) and the JSON entries after it, up to
the version asked for; within one entry removes are applied before adds (an entry replacing a file's
deletion vector both removes and adds its path).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from urllib.parse import unquote

import pyarrow.parquet as pq

from connectors.delta.deletion_vectors import Descriptor, vector_file

__all__ = ["LogFile", "live_files", "obsolete_vector_files", "vectors_in_use"]


@dataclass(frozen=True)
class LogFile:
    """One live data file: its add action's parts a later commit repeats."""

    path: str
    size: int
    modification_time: int
    stats: str | None
    deletion_vector: Descriptor | None


def _of(add: dict) -> LogFile:
    return LogFile(unquote(add["path"]), int(add["size"]), int(add.get("modificationTime") or 0), add.get("stats"),
                   Descriptor.of(add.get("deletionVector")))


def _checkpoint(log: str, version: int) -> tuple[int, dict[str, LogFile]]:
    """(the version of the newest classic checkpoint at or below `version`, its files); (-1, {}) if none."""
    marker = os.path.join(log, "_last_checkpoint")
    found = -1
    if os.path.exists(marker):
        with open(marker) as source:
            found = int(json.load(source)["version"])
    names = sorted(os.listdir(log))
    if found < 0 or found > version:
        found = max((int(n[:20]) for n in names if n.endswith(".checkpoint.parquet") and int(n[:20]) <= version),
                    default=-1)
    if found < 0:
        return -1, {}
    parts = [n for n in names if n.startswith(f"{found:020d}.checkpoint.") and n.endswith(".parquet")]
    files: dict[str, LogFile] = {}
    for part in parts:
        for add in pq.read_table(os.path.join(log, part), columns=["add"]).column("add").to_pylist():
            if add is not None:
                file = _of(add)
                files[file.path] = file
    return found, files


def live_files(root: str, version: int) -> dict[str, LogFile]:
    """The data files of the table at local path `root`, at `version`, by (unquoted) path."""
    log = os.path.join(root, "_delta_log")
    start, files = _checkpoint(log, version)
    for number in range(start + 1, version + 1):
        with open(os.path.join(log, f"{number:020d}.json")) as source:
            actions = [json.loads(line) for line in source if line.strip()]
        for action in actions:
            if "remove" in action:
                files.pop(unquote(action["remove"]["path"]), None)
        for action in actions:
            if "add" in action:
                file = _of(action["add"])
                files[file.path] = file
    return files


def vectors_in_use(root: str, version: int, since_ms: int) -> set[Descriptor]:
    """The deletion vectors a reader of the table at `root` may still need: those of its live files at
    `version`, and those of files removed at or after `since_ms` (a reader of an older version within the
    retention needs them), as the last checkpoint's tombstones and every log entry still present list them."""
    log = os.path.join(root, "_delta_log")
    used = {file.deletion_vector for file in live_files(root, version).values() if file.deletion_vector}

    def removed(action: dict | None) -> None:
        if action and int(action.get("deletionTimestamp") or 0) >= since_ms:
            descriptor = Descriptor.of(action.get("deletionVector"))
            if descriptor is not None:
                used.add(descriptor)

    start, _ = _checkpoint(log, version)
    if start >= 0:
        for part in sorted(os.listdir(log)):
            if part.startswith(f"{start:020d}.checkpoint.") and part.endswith(".parquet"):
                names = pq.read_schema(os.path.join(log, part)).names
                if "remove" in names:
                    for action in pq.read_table(os.path.join(log, part), columns=["remove"]).column("remove").to_pylist():
                        removed(action)
    for name in sorted(os.listdir(log)):
        if len(name) == 25 and name.endswith(".json") and name[:20].isdigit() and int(name[:20]) <= version:
            with open(os.path.join(log, name)) as source:
                for line in source:
                    if line.strip():
                        removed(json.loads(line).get("remove"))
    return used


def obsolete_vector_files(root: str, version: int, retention_hours: float, now_ms: int) -> list[str]:
    """The deletion vector files in the table's root that no reader within `retention_hours` needs: none of
    `vectors_in_use` is in them and they were written before the retention began (a file a commit still
    under way wrote is younger). delta-rs's VACUUM leaves every such file in place."""
    since_ms = now_ms - int(retention_hours * 3_600_000)
    used = {vector_file(root, descriptor) for descriptor in vectors_in_use(root, version, since_ms)}
    found = []
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith("deletion_vector_") and name.endswith(".bin") and path not in used:
            if os.path.getmtime(path) * 1000 < since_ms:
                found.append(path)
    return sorted(found)
