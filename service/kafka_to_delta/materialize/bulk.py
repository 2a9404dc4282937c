"""The materializer's rules applied to many primary keys in one call, and the records <-> rules glue.

The Spark stages (`materializer_stage`, `materializer_buckets`) hand over changelog records as
dicts (CHANGELOG_SCHEMA names plus `_group` and `event_time`); this module turns them into
`Change`s, applies `Materializer` key by key in memory and returns the net rows (NET_SCHEMA
names). Nothing here talks to Spark, so a whole key bucket costs one pass of plain Python and
the state store is touched once per bucket, not once per key.

The state of a key is the rules' state text with the event time it was last touched at (for the
TTL): `StoredState`. A bucket's state maps primary keys to `StoredState`s (`bucket_document`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from operator import itemgetter
from typing import Iterable, Iterator

import orjson

from service.config.choices import Compaction
from service.kafka_to_delta.materialize.bucket_document import StoredState
from service.kafka_to_delta.materialize.bucket_labels import bucket_labels
from service.kafka_to_delta.materialize.fill_unchanged import chain_image, filled_text
from service.kafka_to_delta.materialize.row_digest import digested, digested_state
from service.kafka_to_delta.materialize.rules import (
    Change,
    Materializer,
    MaterializerConfig,
    MaterializerError,
    NetChange,
    Outcome,
)
from service.kafka_to_delta.materialize.rules_fast import simple_outcome
from service.kafka_to_delta.rows.names import EVENT_TIME, GROUP, error_group_key
from service.kafka_to_delta.rows.spark import NET_SCHEMA
from vocabulary.changes import ChangeKind
from vocabulary.redaction import shown

ARRIVAL_ORDER = ("timestamp", "topic", "partition", "offset", "change_index")
ERROR_PREFIX = error_group_key("")
NET_NAMES = tuple(NET_SCHEMA.names)
# The key bucket count of a new checkpoint's materializer; it is part of the state's layout, so a
# checkpoint keeps the count it began with (`plan_upgrade.stored_key_buckets`). 16 against 64, a
# steady batch of 10,000 (in-process, 200,000 envelopes, batches 8-18, two runs each): 64 1.26 / 1.32 s,
# 32 1.27 / 1.20 s, 16 1.15 / 1.17 s, 8 1.28 / 1.28 s, 4 1.36 / 1.37 s. Each bucket call pays several
# round trips to the JVM's state server; fewer, larger buckets trade them for larger documents.
DEFAULT_KEY_BUCKETS = 16
LEGACY_KEY_BUCKETS = 64
"""The count of checkpoints begun before it was recorded per checkpoint."""


@dataclass(frozen=True)
class StageConfig:
    """What the Spark adapter needs besides the rules' own config."""

    rules: MaterializerConfig
    compaction: Compaction = "batch"
    state_ttl_ms: int = 0  # event time without changes after which a key's state is dropped; 0 = never
    whole_row_key: bool = False  # retract mode: no upsert key, the whole row identifies a change
    # State per bucket of hash(key) % key_buckets (part of the checkpoint's layout); 0 = state per key.
    key_buckets: int = DEFAULT_KEY_BUCKETS
    # The buckets' states under labels spread over the shuffle partitions (`bucket_labels`; layout, too).
    spread_buckets: bool = False
    # One live row per key at most (one source, upsert key = primary key): keep rows' digests (`row_digest`).
    row_digests: bool = False

    @property
    def bucket_labels(self) -> tuple[int, ...] | None:
        """The value each bucket's changes are grouped by (None: the bucket numbers)."""
        return bucket_labels(self.key_buckets, self.spread_buckets)

    @property
    def decides_on_columns(self) -> bool:
        """Whether the bucket stage decides the common case on a call's columns (`rules_columns`): batch
        compaction in upsert-key mode without a state TTL."""
        return self.compaction == "batch" and not self.state_ttl_ms and not self.whole_row_key


arrival = itemgetter(*ARRIVAL_ORDER)
"""Sort key of a record: the order the materializer applies a key's changes in (a tuple of its ARRIVAL_ORDER values)."""


def change_of(record: dict, whole_row_key: bool) -> Change:
    """The rules' `Change` for one changelog record."""
    sequence = record.get("sequence")
    return Change(
        key_mode="whole_row" if whole_row_key else "upsert_key",
        kind=ChangeKind(record["kind"]),
        upsert_key=record["upsert_key"],
        row=record["row"],
        position=(record["topic"], int(record["partition"]), int(record["offset"])),
        sequence=None if sequence is None else tuple(orjson.loads(sequence)),
    )


def net_values(key: str, records: list[dict], outcome: Outcome) -> dict:
    """The output row of one compaction of `key` (NET_SCHEMA names); kind null when nothing changes."""
    net, counters = outcome.net, outcome.counters
    kind = row = unchanged = None
    if net is not None:
        kind = ChangeKind.DELETE.value if net.kind == "delete" else ChangeKind.UPDATE_AFTER.value
        row = net.row
        # A winner from an earlier barrier (a rollback) has no record here: its unchanged columns are unknown.
        at = next((i for i in reversed(range(len(records))) if records[i]["row"] == row), None) if row else None
        if at is not None:
            row, unchanged = filled_text(row, records[at].get("unchanged"), _earlier_images(records, at))
    last = records[-1]
    values = dict.fromkeys(NET_NAMES)
    values.update(
        key=key, kind=kind, row=row, unchanged=unchanged,
        types=next((r["types"] for r in reversed(records) if r.get("types")), None),
        topic=last["topic"], partition=int(last["partition"]), offset=int(last["offset"]),
        timestamp=last.get("timestamp"), changes=len(records), conflicts=counters.conflicts,
        rollbacks=counters.rollbacks, stale_dropped=counters.stale_dropped,
        cleared_state_warnings=counters.cleared_state_warnings, state_bytes=counters.state_bytes,
    )
    return values


def _earlier_images(records: list[dict], at: int) -> list[dict]:
    """The images of the key before `records[at]` from its source (a placeholder stands for the value
    that source's previous row held), from the last complete one or delete on (`chain_image`). The
    table holds the value of a column no image here holds: the net row leaves it unchanged."""
    chain: list[dict] = []
    if not records[at].get("unchanged"):
        return chain
    topic = records[at]["topic"]
    for record in records[:at]:
        if record["topic"] == topic:
            chain_image(chain, record["kind"], record["row"], record.get("unchanged"))
    return chain


def passthrough(records: Iterable[dict]) -> Iterator[dict]:
    """Rows that failed an earlier stage, as output rows (NET_SCHEMA names), untouched."""
    for record in records:
        yield {name: record.get(name) for name in NET_NAMES}


def is_failed(group: str) -> bool:
    """True for the group key of a row that failed an earlier stage (each has a key of its own)."""
    return group.startswith(ERROR_PREFIX)


def compact_key(rules: Materializer, key: str, records: list[dict], stored: StoredState | None,
                whole_row_key: bool, ttl_ms: int, row_digests: bool = False) -> tuple[dict, StoredState | None]:
    """Apply one key's due records (arrival order) to its stored state: (net row, state to keep).

    With `row_digests` the rules see and keep the rows' digests; the net row is the text of the change
    whose digest won."""
    previous, touched = stored if stored is not None else (None, None)
    if row_digests:
        previous = digested_state(previous)
    outcome = None if whole_row_key else simple_outcome(rules, key, previous, records, row_digests)
    if outcome is None:
        ruled = digested(records) if row_digests else records
        changes = [change_of(r, whole_row_key) for r in ruled]
        # Data time, not the wall clock: a replayed batch decides the same.
        now_ms = max((int(r[EVENT_TIME]) for r in records if r[EVENT_TIME] is not None), default=0)
        outcome = rules.apply(key, previous, changes, now_ms)
        if row_digests:
            outcome = _with_row_text(rules, key, records, ruled, outcome)
    kept: StoredState | None = None
    if outcome.new_state is not None:
        if ttl_ms:
            latest = max(int(r[EVENT_TIME]) for r in records)
            kept = (outcome.new_state, latest if touched is None else max(touched, latest))
        else:
            kept = (outcome.new_state, None)
    return net_values(key, records, outcome), kept


def _with_row_text(rules: Materializer, key: str, records: list[dict], ruled: list[dict], outcome: Outcome) -> Outcome:
    """`outcome` (decided on digests) with its net row's text: that of the last change of the batch whose
    digest won. A winner that is not among them would be a row of an earlier barrier, whose text the state
    no longer holds: an error (`row_digests` is only set where one live row per key is all there can be)."""
    net = outcome.net
    if net is None or net.row is None:
        return outcome
    at = next((i for i in reversed(range(len(ruled))) if ruled[i]["row"] == net.row), None)
    if at is None:
        raise MaterializerError(
            f"table {rules.config.table}, primary key {shown(key, rules.config.log_values)}: the row to restore is "
            "from an earlier micro-batch and the state keeps only its digest (row digests need one live row per key)")
    return replace(outcome, net=NetChange(net.kind, records[at]["row"]))


def compact_many(rules: Materializer, records: Iterable[dict], states: dict[str, StoredState],
                 whole_row_key: bool, ttl_ms: int = 0, row_digests: bool = False) -> list[dict]:
    """Net rows for every key among `records` (in arrival order, `arrival`; one barrier each); `states` is
    updated in place.

    Failed rows pass through. The rules cost about 0.08 ms per key; nothing else is per key.
    """
    out: list[dict] = []
    by_key: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        by_key[record[GROUP]].append(record)
    for key, group in by_key.items():
        if is_failed(key):
            out.extend(passthrough(group))
            continue
        net, kept = compact_key(rules, key, group, states.get(key), whole_row_key, ttl_ms, row_digests)
        if kept is None:
            states.pop(key, None)
        else:
            states[key] = kept
        out.append(net)
    return out
