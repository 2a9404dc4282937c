"""The materializer's rules for their common case, decided without building their objects.

Most keys of a micro-batch take one shape: every change names the same upsert key, none carries
sequence_by values, and the key's stored state holds at most that upsert key's live row and no
tombstone. Then the state stays one row or none, and the rules (`materializer.Materializer`) come
down to: an add makes its row the live one, a retraction removes it, or, finding none, is counted
and logged as the rules log it; no conflict can arise under any on_conflict strategy, and no
tombstone is read, made or pruned. `simple_outcome` decides such a key exactly as
`Materializer.apply` does (tests/unit/service/kafka_to_delta/materialize/test_rules_fast.py holds the two to the same state
text, net change, counters and warnings on random input) and returns None for every other shape,
which the rules then decide.

A bucket of 6,250 keys receiving 1,080 changes for 600 of them: 4.2-4.3 ms per call this way, 9.1-9.4 ms
with every key through the rules (`bench/bucket_call_costs.py`).
"""

from __future__ import annotations

from typing import Any

import orjson

from service.kafka_to_delta.materialize.key_state import STATE_VERSION, is_position, one_row_state
from service.kafka_to_delta.materialize.row_digest import row_digest
from service.kafka_to_delta.materialize.rules import (
    STATE_CLEARED_WARNING,
    Counters,
    Materializer,
    NetChange,
    Outcome,
)
from service.kafka_to_delta.materialize.rules import log as rules_log
from vocabulary.errors import SourceCoordinates
from vocabulary.redaction import shown

_ADDS = frozenset(("+I", "+U"))
_KINDS = _ADDS | frozenset(("-U", "-D"))
_STATE_FIELDS = frozenset(("v", "l"))
_ROW_FIELDS = frozenset(("r", "p", "k"))


def simple_outcome(rules: Materializer, pk: str, state: str | None, records: list[dict],
                   digests: bool = False) -> Outcome | None:
    """The rules' outcome for `records` (one key's changelog records in arrival order, upsert-key mode) on
    the stored `state`, or None when they or the state are not of the common shape.

    `digests`: the state keeps the live row's digest (`row_digest`), `state` holds digests only
    (`digested_state`); the net row is still the winning change's text."""
    upsert_key = records[0]["upsert_key"]
    if not isinstance(upsert_key, str):
        return None
    for record in records:
        kind = record["kind"]
        if record["upsert_key"] != upsert_key or record.get("sequence") is not None:
            return None
        if kind not in _KINDS:
            return None
        if kind in _ADDS and not isinstance(record["row"], str):
            return None
    common, live = stored_row(state, upsert_key)
    if not common:
        return None
    emitted = None if live is None else live[0]
    counters = Counters()
    arrived = False  # whether the live row is one of `records` (else the stored one, as stored)
    for record in records:
        position = (record["topic"], int(record["partition"]), int(record["offset"]))
        if record["kind"] in _ADDS:
            live, arrived = (record["row"], position), True
        elif live is not None:
            live = None
        else:
            rules_log.warning(STATE_CLEARED_WARNING, rules.config.table, shown(pk, rules.config.log_values),
                              record["kind"], str(SourceCoordinates(*position)))
            counters.cleared_state_warnings += 1
    text = kept = None
    if live is not None:
        kept = row_digest(live[0]) if digests and arrived else live[0]
        text = one_row_state(upsert_key, kept, live[1])
        counters.live_rows = 1
        counters.state_bytes = len(text.encode())
    net = None
    if live is not None and kept != emitted:
        net = NetChange("upsert", live[0])
    elif live is None and emitted is not None:
        net = NetChange("delete", None)
    return Outcome(text, net, counters, None)


def stored_row(state: str | None, upsert_key: str) -> tuple[bool, tuple[str, tuple] | None]:
    """(whether a stored state is of the common shape, its live row as (row, position) or None)."""
    if state is None:
        return True, None
    try:
        data: Any = orjson.loads(state)
    except orjson.JSONDecodeError:
        return False, None
    if not isinstance(data, dict) or data.keys() != _STATE_FIELDS or data["v"] != STATE_VERSION:
        return False, None
    rows = data["l"]
    if not isinstance(rows, list) or len(rows) > 1:
        return False, None
    if not rows:
        return True, None
    item = rows[0]
    if not isinstance(item, dict) or item.keys() != _ROW_FIELDS or item["k"] != upsert_key:
        return False, None
    row, position = item["r"], item["p"]
    if not isinstance(row, str) or not is_position(position):
        return False, None
    return True, (row, tuple(position))
