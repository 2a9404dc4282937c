"""The regular join's output side, pure: joined pairs of input rows -> output rows, the difference of
two joins -> changes per output primary key, and those changes through the materializer rules.

An output row is the left row's columns, then the right row's; a right column whose name the left row
also has gets the suffix `0`. Its upsert key is the pair (left pk, right pk) as JSON; its primary key
the declared output key's values (a left join's nulls cannot be part of it).
"""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa

from service.kafka_to_delta.barrier import outlived
from service.kafka_to_delta.formats.debezium_json import canonical_key, compact_json
from service.kafka_to_delta.joins.output_order import in_output_order
from service.kafka_to_delta.materialize.rules import (
    Change,
    Counters,
    Materializer,
    MaterializerConfig,
)
from vocabulary.changes import ChangeKind
from vocabulary.errors import TerminalError

RIGHT_SUFFIX = "0"
OUTPUT_SCHEMA = pa.schema([("key", pa.string()), ("kind", pa.string()), ("row", pa.string()), ("types", pa.string())])
"""The output's net changes, in the form `MergeSink.apply` takes (key: JSON list of primary-key values)."""
OutputRow = tuple[str, str, "str | None", tuple[str, int, int]]
"""(output primary key, row text, declared types text, source position) of one upsert key."""


class JoinKeyError(TerminalError):
    """An output row cannot be keyed (a primary-key column missing or null)."""


class OutputRows:
    """Joined pairs -> output rows (upsert key, output primary key, row text, types text, position)."""

    def __init__(self, primary_key: tuple[str, ...]) -> None:
        self.key = primary_key
        self._types: dict[tuple[str | None, str | None], str | None] = {}

    def rows(self, pairs: pa.Table) -> dict[str, OutputRow]:
        """Output rows of joined pairs (`_joined` columns) by upsert key."""
        out = {}
        for pair in pairs.to_pylist():
            left = orjson.loads(pair["l_row"])
            right = orjson.loads(pair["r_row"]) if pair["r_row"] is not None else {}
            row = {**left, **{(c + RIGHT_SUFFIX if c in left else c): v for c, v in right.items()}}
            position = (pair["l_topic"], pair["l_partition"], pair["l_offset"])  # named in conflict messages
            upsert_key = f"[{pair['l_pk']},{pair['r_pk'] or 'null'}]"
            out[upsert_key] = (self._primary_key(row), compact_json(row), self._types_of(pair, left), position)
        return out

    def _primary_key(self, row: dict) -> str:
        values = [row.get(c) for c in self.key]
        if any(v is None for v in values):
            missing = [c for c, v in zip(self.key, values) if v is None]
            raise JoinKeyError(f"an output row has no value for primary-key column(s) {missing} (a left join's "
                               f"primary key must be made of left columns)")
        return canonical_key(values)

    def _types_of(self, pair: dict, left: dict) -> str | None:
        texts = (pair["l_types"], pair["r_types"])
        if texts not in self._types:
            declared = orjson.loads(texts[0]) if texts[0] else {}
            for column, kind in (orjson.loads(texts[1]) if texts[1] else {}).items():
                declared[column + RIGHT_SUFFIX if column in left else column] = kind
            self._types[texts] = compact_json(declared) if declared else None
        return self._types[texts]


def output_changes(old: dict, new: dict) -> dict[str, list[tuple[Change, str | None]]]:
    """Per output primary key: retractions of old rows the new join lacks, then additions of new or
    changed rows (each with its types)."""
    by_pk: dict[str, list[tuple[Change, str | None]]] = {}
    for ukey in sorted(old.keys() - new.keys()):
        pk, row, _, position = old[ukey]
        by_pk.setdefault(pk, []).append((Change(ChangeKind.DELETE, ukey, row, position), None))
    for ukey in sorted(new):
        pk, row, types, position = new[ukey]
        if ukey not in old or old[ukey][1] != row:
            by_pk.setdefault(pk, []).append((Change(ChangeKind.UPDATE_AFTER, ukey, row, position), types))
    return by_pk


def materialized(config: MaterializerConfig, state: dict[str, tuple[str, int]], by_pk: dict, clock: int
                  ) -> tuple[pa.Table, dict[str, tuple[str, int]], list[str], Counters]:
    materializer, counters = Materializer(config), Counters()
    out: dict[str, list[Any]] = {name: [] for name in OUTPUT_SCHEMA.names}
    stored: dict[str, tuple[str, int]] = {}
    removed: list[str] = []
    for pk, entries in by_pk.items():
        known = state.get(pk)
        outcome = materializer.apply(pk, known[0] if known else None, [c for c, _ in entries], clock)
        counters.add(outcome.counters)
        if outcome.new_state is None:
            removed += [pk] if known else []
        else:
            stored[pk] = (outcome.new_state, clock)
        if outcome.net is not None:
            types = next((t for c, t in reversed(entries) if c.row == outcome.net.row), None)
            kind = ChangeKind.DELETE if outcome.net.kind == "delete" else ChangeKind.UPDATE_AFTER
            for name, value in zip(OUTPUT_SCHEMA.names, (pk, kind.value, outcome.net.row, types)):
                out[name].append(value)
    return in_output_order(pa.table(out, schema=OUTPUT_SCHEMA)), stored, removed, counters


def expire_output(state: dict[str, tuple[str, int]], ttl_ms: int, clock: int) -> list[str]:
    """The output keys whose materializer state was not touched for the TTL (0: none)."""
    return [pk for pk, (_, touched) in state.items() if outlived(touched, ttl_ms, clock)]
