"""Columns a change left unchanged (a TOAST placeholder), filled from the key's earlier images.

A delete ends the key's images: it is passed on as an image whose row is JSON `null`, and a
placeholder after it, with no image since holding the column, stands for null (the row it would
keep is gone), as across batches, where the deleted row is no longer stored."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from service.kafka_to_delta.formats.debezium_json import compact_json
from service.kafka_to_delta.rows.names import EARLIER_IMAGES, Column
from vocabulary.changes import ChangeKind

_IMAGE_KINDS = (ChangeKind.INSERT.value, ChangeKind.UPDATE_BEFORE.value, ChangeKind.UPDATE_AFTER.value)
_ENDING_KINDS = (*_IMAGE_KINDS, ChangeKind.DELETE.value)
DELETED_ROW = "null"
"""The row text of a delete among a key's images."""


def fill_unchanged(row: dict, unchanged: list[str], images: list[dict]) -> tuple[dict, list[str]]:
    """(row, columns still unchanged): each unchanged column taken from the latest of the key's
    earlier `images` (source order, `row` JSON text without its own unchanged columns) holding it:
    every image holds each column it does not leave unchanged (null where its row lacks it); a
    delete (`DELETED_ROW`) holds null for every column."""
    known: dict = {}
    for image in images:
        if image["row"] is None:
            continue
        values = json.loads(image["row"])
        if values is None:
            known = dict.fromkeys(unchanged)
            continue
        own = set(json.loads(image["unchanged"])) if image.get("unchanged") else set()
        known.update(values)
        known.update((c, None) for c in unchanged if c not in values and c not in own)
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


def chain_image(chain: list[dict], kind: str, row: str | None, unchanged: str | None) -> None:
    """Add one change (source order) to a key's chain of earlier images, which starts at the key's last
    complete image or delete: the images `fill_unchanged` takes. Changes other than images and
    deletes are left out."""
    if kind not in _ENDING_KINDS:
        return
    deleted = kind == ChangeKind.DELETE.value
    if unchanged is None or deleted:
        chain.clear()
    chain.append({"row": DELETED_ROW if deleted else row, "unchanged": None if deleted else unchanged})


def filled_text(text: str | None, unchanged: str | None, chain: list[dict] | None) -> tuple[str | None, str | None]:
    """(row text, unchanged columns as JSON text or None) of a change filled from its key's `chain`."""
    if not chain or not unchanged or text is None:
        return text, unchanged
    row, still = fill_unchanged(json.loads(text), json.loads(unchanged), chain)
    return compact_json(row), json.dumps(still) if still else None


def filled_images(last: pa.Table, changes: pa.Table) -> pa.Table:
    """`last` with each row that left columns unchanged filled from its key's earlier images."""
    unchanged = last.column(Column.UNCHANGED)
    if unchanged.null_count == last.num_rows:
        return last
    partial_keys = pc.filter(last.column(Column.KEY), pc.is_valid(unchanged))
    images = changes.filter(pc.and_(pc.is_in(changes.column(Column.KEY), partial_keys),
                                    pc.is_in(changes.column(Column.KIND), pa.array(_ENDING_KINDS))))
    by_key: dict[str, list[dict]] = {}
    for image in images.select([Column.KEY, Column.KIND, Column.ROW, Column.UNCHANGED]).to_pylist():
        chain_image(by_key.setdefault(image[Column.KEY], []), image[Column.KIND], image[Column.ROW],
                    image[Column.UNCHANGED])
    texts, lefts = [], []
    for key, text, left in zip(*(last.column(c).to_pylist() for c in (Column.KEY, Column.ROW, Column.UNCHANGED))):
        text, left = filled_text(text, left, by_key.get(key))
        texts.append(text)
        lefts.append(left)
    last = last.set_column(last.schema.get_field_index(Column.ROW), Column.ROW, pa.array(texts, pa.string()))
    return last.set_column(last.schema.get_field_index(Column.UNCHANGED), Column.UNCHANGED,
                           pa.array(lefts, pa.string()))
