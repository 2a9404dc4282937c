"""Columns a change left unchanged (a TOAST placeholder), filled from the key's earlier images."""

from __future__ import annotations

import json

import pyarrow as pa

from service.kafka_to_delta.materialize.net_changes import EARLIER_IMAGES


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


def filled_net(net: pa.Table) -> pa.Table:
    """Net rows whose unchanged columns an earlier image of the batch holds, filled from it."""
    if EARLIER_IMAGES not in net.column_names or net.column(EARLIER_IMAGES).null_count == net.num_rows:
        return net
    texts, lefts = [], []
    for text, unchanged, images in zip(*(net.column(c).to_pylist() for c in ("row", "unchanged", EARLIER_IMAGES))):
        if images and unchanged and text is not None:
            row, left = fill_unchanged(json.loads(text), json.loads(unchanged), images)
            text, unchanged = json.dumps(row, separators=(",", ":")), json.dumps(left) if left else None
        texts.append(text)
        lefts.append(unchanged)
    net = net.set_column(net.schema.get_field_index("row"), "row", pa.array(texts, pa.string()))
    return net.set_column(net.schema.get_field_index("unchanged"), "unchanged", pa.array(lefts, pa.string()))
