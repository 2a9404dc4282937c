"""Tables of a database source set aside after a terminal error, and where each resumes.

One JSON file per database, in its checkpoint directory: `{table: {"reason", "batch_id",
"topics", "offsets", "state"}}`. `offsets` are the table's topics' offsets at the start of the
batch that failed (nothing of that batch reached the table). While `state` is `quarantined` the
source plans no range of the table's topics; at the next start of the service the table is
tried again (`resuming`): its topics are read from those offsets in the first micro-batch,
and the entry goes once that batch is in the table.

Written by the driver, read by the source's planner: each write replaces the file atomically.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from service.runtime.checkpoints import write_json

FILE_NAME = "quarantine.json"
QUARANTINED = "quarantined"
RESUMING = "resuming"


def read(path: str) -> dict[str, dict[str, Any]]:
    """The entries; none when the file does not exist."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return {}


def write(path: str, entries: dict[str, dict[str, Any]]) -> None:
    """Replace the file with `entries` (atomically: the planner never reads half a file)."""
    write_json(Path(path), entries)


def topic_states(entries: dict[str, dict[str, Any]]) -> tuple[set[str], dict[str, dict[str, int]]]:
    """(topics not to read, `{topic: {partition: offset}}` to read again from)."""
    skipped: set[str] = set()
    rewound: dict[str, dict[str, int]] = {}
    for entry in entries.values():
        if entry.get("state") == QUARANTINED:
            skipped.update(entry.get("topics", []))
        elif entry.get("state") == RESUMING:
            for topic in entry.get("topics", []):
                rewound[topic] = dict(entry.get("offsets", {}).get(topic, {}))
    return skipped, rewound
