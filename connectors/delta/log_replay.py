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

from connectors.delta.deletion_vectors import Descriptor

__all__ = ["LogFile", "live_files"]


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
