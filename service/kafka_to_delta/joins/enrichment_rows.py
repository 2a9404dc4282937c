"""Row logic of the enrichment join, on Arrow tables of changelog rows (`CHANGELOG_SCHEMA`).

- `build_changes`: a batch of build changes -> the last change per join key (upsert or delete);
  `-U` rows are ignored (the `+U` that follows carries the new row).
- `enrich`: probe changes joined with the build rows current now. Each `+I`/`+U` probe row
  becomes one output upsert (probe columns, then build columns; a build column whose name a probe
  column already has gets the suffix `0`); a `-D` probe row deletes its output row. A probe
  upsert with no build row is *missing*: the caller applies the `missing` policy to those.
  Within the batch, the last change per output key wins (source order: topic, partition, offset).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from service.kafka_to_delta.joins.output_order import in_output_order
from service.kafka_to_delta.rows.names import Column
from vocabulary.changes import ChangeKind

BUILD_STATE_SCHEMA = pa.schema([("key", pa.string()), ("row", pa.string()), ("types", pa.string())])
BUILD_CHANGES_SCHEMA = BUILD_STATE_SCHEMA.append(pa.field("deleted", pa.bool_()))
NET_SCHEMA = pa.schema([("key", pa.string()), ("kind", pa.string()), ("row", pa.string()), ("types", pa.string())])
"""The net changes `MergeSink.apply` takes."""
_UPSERTS = (ChangeKind.INSERT.value, ChangeKind.UPDATE_AFTER.value)


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=False)


def key_text(row: Mapping[str, object], columns: Sequence[str]) -> str | None:
    """The JSON list of the row's values of `columns`; None when one is missing or null."""
    values = [row.get(c) for c in columns]
    return None if any(v is None for v in values) else _compact(values)


def good_rows(changes: pa.Table) -> pa.Table:
    """The changelog rows that decoded (no error), without TRUNCATE markers."""
    ok = pc.and_(pc.is_null(changes.column(Column.ERROR)), pc.is_valid(changes.column(Column.ROW)))
    return changes.filter(ok)


def build_changes(changes: pa.Table, join_key: Sequence[str]) -> pa.Table:
    """The last change per build join key of a batch (`BUILD_CHANGES_SCHEMA`)."""
    last: dict[str, tuple[str, str | None, bool]] = {}
    rows = good_rows(changes)
    for kind, text, types in zip(*(rows.column(c).to_pylist() for c in (Column.KIND, Column.ROW, Column.TYPES))):
        if kind == ChangeKind.UPDATE_BEFORE.value:
            continue
        key = key_text(json.loads(text), join_key)
        if key is None:
            continue
        last[key] = (text, types, kind == ChangeKind.DELETE.value)
    return pa.table({
        "key": list(last), "row": [v[0] for v in last.values()], "types": [v[1] for v in last.values()],
        "deleted": [v[2] for v in last.values()],
    }, schema=BUILD_CHANGES_SCHEMA)


def probe_keys(probes: pa.Table, join_key: Sequence[str]) -> list[str]:
    """The distinct join keys of the probe rows (to look the build rows up)."""
    rows = good_rows(probes)
    keys = {key_text(json.loads(text), join_key) for text in rows.column(Column.ROW).to_pylist()}
    return sorted(k for k in keys if k is not None)


@dataclass(frozen=True)
class Enriched:
    """The output of one batch of probes: net changes for the output table, and the missing."""

    net: pa.Table  # NET_SCHEMA
    missing: pa.Table  # the probe changelog rows (CHANGELOG_SCHEMA) that found no build row
    joined: int  # probe upserts that found their build row


def _output_columns(probe: Mapping[str, object], build: Mapping[str, object]) -> dict[str, object]:
    out = dict(probe)
    for column, value in build.items():
        out[f"{column}0" if column in probe else column] = value
    return out


def _output_types(probe_types: str | None, build_types: str | None, probe_columns: Sequence[str]) -> str | None:
    if probe_types is None and build_types is None:
        return None
    types = dict(json.loads(probe_types)) if probe_types else {}
    for column, kind in (json.loads(build_types) if build_types else {}).items():
        types[f"{column}0" if column in probe_columns else column] = kind
    return _compact(types)


def enrich(probes: pa.Table, build: Mapping[str, tuple[str, str | None]], probe_join_key: Sequence[str],
           output_key: Sequence[str], emit_missing: bool) -> Enriched:
    """Join probe changes with `build` (join key text -> (row JSON, types JSON)); see the module doc.

    `emit_missing`: a missing probe upsert is output with null build columns (else left out).
    """
    rows = good_rows(probes)
    net: dict[str, tuple[str, str, str | None]] = {}
    missing, joined = [], 0
    columns = (Column.KIND, Column.ROW, Column.TYPES)
    for index, (kind, text, types) in enumerate(zip(*(rows.column(c).to_pylist() for c in columns))):
        if kind not in _UPSERTS and kind != ChangeKind.DELETE.value:
            continue
        probe = json.loads(text)
        key = key_text(probe, probe_join_key)
        found = build.get(key) if key is not None else None
        if kind in _UPSERTS and found is None:
            missing.append(index)
            if not emit_missing:
                continue
        elif kind in _UPSERTS:
            joined += 1
        out = _output_columns(probe, json.loads(found[0]) if found else {})
        out_key = key_text(out, output_key)
        if out_key is None:
            continue
        out_types = _output_types(types, found[1] if found else None, list(probe))
        out_kind = ChangeKind.DELETE.value if kind == ChangeKind.DELETE.value else ChangeKind.UPDATE_AFTER.value
        net[out_key] = (out_kind, _compact(out), out_types)
    table = pa.table({
        "key": list(net), "kind": [v[0] for v in net.values()], "row": [v[1] for v in net.values()],
        "types": [v[2] for v in net.values()],
    }, schema=NET_SCHEMA)
    return Enriched(in_output_order(table), rows.take(pa.array(missing, pa.int64())), joined)
