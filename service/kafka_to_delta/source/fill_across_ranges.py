"""Unchanged (TOAST) columns of a batch's net changes filled across the Kafka ranges that hold them.

A range fills a placeholder from the key's earlier images of that range (`debezium_columns`,
`fill_unchanged`); what none of them holds reaches the driver as `unchanged`. When one partition is
read in pieces (`connectors.kafka.offsets.split_spans`), the image may sit in an earlier piece: the
driver keeps the last change per key, and fills each column it left unchanged from the latest
earlier upsert of the same key in the same topic partition that does not leave it unchanged too
(as within a range, an image holds every column it does not leave unchanged: one its schema
version lacks holds null). What no range holds stays `unchanged`: the sink keeps the stored
value. All in Arrow; Python runs once per distinct `unchanged` list, not per row.

As within a range, a delete ends the key's images: a placeholder after it, with no image since
holding the column, is null (the row it would keep is gone); the placeholder of a key deleted and
re-inserted is filled from the re-insert, which Debezium writes whole. So a piece's last change
per key is all the driver needs, whatever images came before it in that piece.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from service.kafka_to_delta.materialize.last_change import last_positions
from service.kafka_to_delta.rows.names import Meta
from vocabulary.changes import ChangeKind


def _contains(unchanged: pa.ChunkedArray, texts: list[str], lists: list[list[str]], column: str) -> np.ndarray:
    """Per row: whether its `unchanged` list names `column`."""
    named = np.array([column in names for names in lists] + [False], np.bool_)
    code = pc.fill_null(pc.index_in(unchanged, value_set=pa.array(texts, pa.string())), -1)
    return named[code.to_numpy()]


def filled_last_rows(changes: pa.Table) -> pa.Table:
    """The last row per key of `changes` (the ranges' rows, conformed to one schema, in any order: source
    order is `Meta.ORDER`), in source order, its unchanged columns filled across ranges.

    Only the columns that decide (key, kind, unchanged, topic, partition) are put in source order; the row
    columns (the long texts of a real table among them) are taken once for the rows kept, and a filled
    column's values once for the images it is filled from."""
    if changes.num_rows == 0:
        return changes
    sequence = pc.sort_indices(changes.select(list(Meta.ORDER)), [(name, "ascending") for name in Meta.ORDER])
    ordered = changes.select([Meta.KEY, Meta.KIND, Meta.UNCHANGED, Meta.TOPIC, Meta.PARTITION]).take(sequence)
    sequence = sequence.to_numpy()
    kept = last_positions(ordered.column(Meta.KEY))
    last = changes.take(pa.array(sequence[kept]))
    unchanged = last.column(Meta.UNCHANGED)
    if unchanged.null_count == last.num_rows:
        return last
    fill_keys = _fill_key(ordered)
    last_keys = fill_keys.take(pa.array(kept))
    texts = pc.unique(ordered.column(Meta.UNCHANGED).drop_null()).to_pylist()
    lists = [json.loads(text) for text in texts]
    wanted = [c for c in dict.fromkeys(c for names in lists for c in names) if c in last.column_names]
    upserts = pc.equal(ordered.column(Meta.KIND), ChangeKind.UPDATE_AFTER.value).to_numpy(zero_copy_only=False)
    deletes = pc.equal(ordered.column(Meta.KIND), ChangeKind.DELETE.value).to_numpy(zero_copy_only=False)
    last_upserts = pc.equal(last.column(Meta.KIND), ChangeKind.UPDATE_AFTER.value).to_numpy(zero_copy_only=False)
    filled: dict[str, np.ndarray] = {}
    for column in wanted:
        need = last_upserts & _contains(unchanged, texts, lists, column)
        if not need.any():
            continue
        holds = upserts & ~_contains(ordered.column(Meta.UNCHANGED), texts, lists, column)
        candidates = np.flatnonzero(holds | deletes)
        holders = candidates[last_positions(fill_keys.take(pa.array(candidates)))]  # each key's latest
        position = pc.index_in(last_keys, value_set=fill_keys.take(pa.array(holders)))
        found = need & position.is_valid().to_numpy(zero_copy_only=False)
        if not found.any():
            continue
        stored = changes.column(column).take(pa.array(sequence[holders]))
        stored = pc.if_else(pa.array(deletes[holders]), pa.scalar(None, stored.type), stored)  # a delete: null
        index = last.schema.get_field_index(column)
        last = last.set_column(index, column, pc.if_else(pa.array(found), stored.take(position), last.column(column)))
        filled[column] = found
    if filled:
        last = last.set_column(last.schema.get_field_index(Meta.UNCHANGED), Meta.UNCHANGED,
                               _still_unchanged(unchanged, filled))
    return last


def _fill_key(table: pa.Table) -> pa.ChunkedArray:
    """Key, topic and partition as one text: a fill never crosses partitions."""
    return pc.binary_join_element_wise(table.column(Meta.KEY), table.column(Meta.TOPIC),
                                       pc.cast(table.column(Meta.PARTITION), pa.string()), "\x1f")


def _still_unchanged(unchanged: pa.ChunkedArray, filled: dict[str, np.ndarray]) -> pa.Array:
    """`unchanged` without the columns `filled` per row; null where none is left. The JSON is built
    once per distinct (list, filled columns) pair, found by sorting one integer per row."""
    names = list(filled)
    texts = pc.unique(unchanged.drop_null()).to_pylist()
    code = pc.fill_null(pc.index_in(unchanged, value_set=pa.array(texts, pa.string())), -1).to_numpy()
    group = code.astype(np.int64) + 1  # per row: which (list, filled columns) pair, kept below 2 x rows
    for name in names:
        group = np.unique(group * 2 + filled[name], return_inverse=True)[1].reshape(-1)
    _, first, inverse = np.unique(group, return_index=True, return_inverse=True)
    pairs = [(int(code[row]), [bool(filled[name][row]) for name in names]) for row in first.tolist()]
    results: list[str | None] = []
    for text, flags in pairs:
        if text < 0:
            results.append(None)
            continue
        gone = {name for name, flag in zip(names, flags) if flag}
        left = [c for c in json.loads(texts[text]) if c not in gone]
        results.append(json.dumps(left, separators=(",", ":")) if left else None)
    return pa.array(results, pa.string()).take(pa.array(inverse.reshape(-1), pa.int64()))
