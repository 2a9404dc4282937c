"""Columns a change left unchanged (a TOAST placeholder), filled from the key's earlier images."""

from __future__ import annotations

import json


def fill_unchanged(row: dict, unchanged: list[str], images: list[dict]) -> tuple[dict, list[str]]:
    """(row, columns still unchanged): each unchanged column taken from the latest of the key's
    earlier `images` (source order, `row` JSON text without its own unchanged columns) holding it."""
    known: dict = {}
    for image in images:
        if image["row"] is not None:
            known.update(json.loads(image["row"]))
    filled = {c for c in unchanged if c in known}
    ordered = {**known, **row}  # the complete image's column order
    return ({c: v for c, v in ordered.items() if c in row or c in filled},
            [c for c in unchanged if c not in filled])
