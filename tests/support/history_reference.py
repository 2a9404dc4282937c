"""An SCD type 2 history computed the obvious way, for tests: every change of the source, sorted, walked."""

from __future__ import annotations

from typing import Any

from service.config.history import DELETED, END_AT, START_AT, UPDATED_AT

Change = tuple[Any, Any, bool, dict[str, Any]]
"""(key, sequence, delete?, the row's values besides the key: ignored for a delete)."""


def reference(changes: list[tuple[int, int, bool, str | None, int]], tracked: tuple[str, ...], markers: bool) -> list[dict]:
    """`reference_rows` of changes (id, sequence, delete?, a, b) in delivery order."""
    rows = [(key, seq, deleted, {"a": a, "b": b}) for key, seq, deleted, a, b in changes]
    return reference_rows(rows, ("a", "b"), tracked, markers)


def reference_rows(changes: list[Change], columns: tuple[str, ...], tracked: tuple[str, ...], markers: bool,
                   key_column: str = "id") -> list[dict]:
    """History rows of `changes` in delivery order: per key, sorted by sequence (a later delivery wins at an
    equal sequence), walked one change at a time. A delete is kept as a marker row when it closes nothing
    (or always, with `markers`): its key alone, valid until the key's next change."""
    rows: list[dict] = []
    for key in sorted({c[0] for c in changes}):
        latest: dict[Any, Change] = {}
        for c in changes:
            if c[0] == key:
                latest[c[1]] = c  # a later delivery replaces an earlier one at the same sequence
        current: dict | None = None
        marker: dict | None = None
        for seq in sorted(latest):
            _, _, is_delete, row = latest[seq]
            if marker is not None:
                marker[END_AT] = seq
                marker = None
            if is_delete:
                if markers or current is None:
                    marker = {key_column: key, **{c: None for c in columns}, START_AT: seq, END_AT: None,
                              UPDATED_AT: seq, DELETED: True}
                    rows.append(marker)
                if current is not None:
                    current[END_AT] = seq
                    rows.append(current)
                    current = None
                continue
            values = {c: row.get(c) for c in columns}
            if current is not None and all(current[c] == values[c] for c in tracked):
                current.update(values, **{UPDATED_AT: seq})
                continue
            if current is not None:
                current[END_AT] = seq
                rows.append(current)
            current = {key_column: key, **values, START_AT: seq, END_AT: None, UPDATED_AT: seq, DELETED: False}
        if current is not None:
            rows.append(current)
    return sorted(rows, key=lambda r: (r[key_column], r[START_AT]))
