"""Keyed-state materializer: the changes of one barrier for one sink primary key -> at most one net change.

Pure logic without I/O (spec: sink-upsert-materializer; on-conflict, "ON CONFLICT" and "Compaction").
The streaming adapter groups the changes that became final at a barrier by primary key, keeps the
state string of each key and applies the returned net change to the table with a MERGE.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Callable, Literal, Sequence, get_args

from service.config.choices import OnConflict
from service.kafka_to_delta.barrier import outlived
from service.kafka_to_delta.materialize.key_state import (
    KeyMode,
    LiveRow,
    PkState,
    Position,
    StateFormatError,
    Tombstone,
    decode_state,
    encode_state,
)
from vocabulary.changes import ChangeKind
from vocabulary.errors import ConfigError, SourceCoordinates, TerminalError
from vocabulary.redaction import shown

log = logging.getLogger(__name__)

NetKind = Literal["upsert", "delete"]

STATE_CLEARED_WARNING = (
    "table %s, primary key %s: %s from %s found no live row to retract (state expired or never held it, "
    "or it was dropped as a conflict); ignored"
)
STALE_CHANGE_MESSAGE = "table %s, primary key %s: %s from %s is older than what is known for its upsert key; dropped"
_CONFLICT_LISTED = 10


class MaterializerError(TerminalError):
    """The materializer cannot go on for a key (unreadable state, sequence values that do not compare)."""


class ConflictError(MaterializerError):
    """on_conflict=error and a primary key holds more than one live row after a barrier."""


def _where(position: Position) -> str:
    return str(SourceCoordinates(*position))


@dataclass(frozen=True)
class Change:
    """One changelog row routed to one primary key.

    `upsert_key` is the canonical JSON of the upsert-key values; with key_mode "whole_row" (retract
    mode, no upsert key) the canonical JSON of the whole row. Upsert keys of different sources must
    not collide (the adapter prefixes them with the source when several sources feed a table).
    `row` is opaque text compared for equality only (for a partial delete: the key columns).
    `sequence` holds the sequence_by values (JSON scalars that compare with each other) or None.
    """

    kind: ChangeKind
    upsert_key: str
    row: str
    position: Position
    sequence: tuple | None = None
    key_mode: KeyMode = "upsert_key"

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ChangeKind(self.kind))


@dataclass(frozen=True)
class NetChange:
    """What the table must do for a primary key: upsert `row`, or delete (row None)."""

    kind: NetKind
    row: str | None


@dataclass(frozen=True)
class MaterializerConfig:
    """Per sink table. tombstone_retention_ms: with sequence_by, how long a delete is remembered (0 = forever)."""

    table: str
    primary_key: tuple[str, ...]
    on_conflict: OnConflict
    tombstone_retention_ms: int = 0
    log_values: bool = False  # key values in messages (vocabulary/redaction.py); carried to the executors

    def __post_init__(self) -> None:
        if self.on_conflict not in get_args(OnConflict):
            raise ConfigError(f"table {self.table}: on_conflict must be one of {get_args(OnConflict)}")
        if self.tombstone_retention_ms < 0:
            raise ConfigError(f"table {self.table}: tombstone_retention_ms must be >= 0")
        if not self.primary_key:
            raise ConfigError(f"table {self.table}: the materializer needs a primary key")


@dataclass
class Counters:
    """What one call did. live_rows, tombstones and state_bytes describe the key's state afterwards."""

    conflicts: int = 0
    rollbacks: int = 0
    stale_dropped: int = 0
    cleared_state_warnings: int = 0
    live_rows: int = 0
    tombstones: int = 0
    state_bytes: int = 0

    def add(self, other: Counters) -> None:
        """Accumulate `other` into this one (totals over keys)."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass(frozen=True)
class Outcome:
    """Result of one call: the state to keep (None: drop it), the net change, counters.

    wake_at_ms: when retained tombstones expire; calling apply with no changes then prunes them.
    """

    new_state: str | None
    net: NetChange | None
    counters: Counters
    wake_at_ms: int | None = None


@dataclass
class _Barrier:
    pk: str
    state: PkState
    now_ms: int
    counters: Counters


def _find(rows: list[LiveRow], upsert_key: str) -> int | None:
    return next((i for i, live in enumerate(rows) if live.upsert_key == upsert_key), None)


class Materializer:
    """Applies the final changes of one barrier to one primary key and returns at most one net change.

    Rules (dispatch on the change kind to `_add` / `_retract`, then on on_conflict to `_decide_*`):
    1. State per key: the live rows in arrival order (upsert key, row, position, sequence) and, with
       sequence_by, tombstones (upsert key -> sequence, position, deleted_at_ms). The row in the table
       is the last live row, under every strategy, so it is not stored separately.
    2. Add (+I/+U) for upsert key U: a live row of U is replaced in place (it keeps its place in arrival
       order); otherwise the row is appended. In whole-row mode every add is appended (duplicates are
       separate rows). Retract (-U/-D): removes the live row of U (whole-row mode: the first equal row).
       A retraction that finds nothing is logged (STATE_CLEARED_WARNING, no row contents), counted in
       cleared_state_warnings and ignored. Under `nothing` this includes retractions of rows that were
       dropped as conflicts.
    3. sequence_by (Change.sequence not None): a change older than the newest known for U - its live row,
       or its tombstone - is dropped (stale_dropped); ties are broken by position (topic, partition,
       offset), an equal (sequence, position) is applied. A retraction leaves a tombstone for U. It is
       kept for tombstone_retention_ms after now_ms of the delete (0 = forever), then pruned: a late older
       add arriving after that IS applied. Tombstones live in the state of one primary key: a late add
       routed to a key that never held U cannot be recognised as stale.
    4. After the barrier, by on_conflict: `error` - more than one live row (distinct upsert keys, or
       duplicates in whole-row mode) raises ConflictError naming the keys and their positions, never row
       contents. `nothing` - the winner is the current one if its upsert key is still live, else the
       earliest-arrived live row; every other live row is dropped from state (counted in conflicts), so
       the state stays one row; retracting the winner deletes until a new add. `deduplicate` - every live
       row is kept, the table shows the last; retracting it rolls back to the previous live row (counted
       in rollbacks), retracting the last one deletes. The state grows with the number of live rows per
       key (all concurrent versions), which is the price of rollback.
    5. Net change against the row in the table before the barrier: a different winner row -> upsert; no
       winner and a row in the table -> delete; else nothing. The state is dropped (None) when no row is
       live and no tombstone is retained.
    6. counters.state_bytes is the UTF-8 length of the returned state string.

    The barrier must never fall between a -U and the +U of the same update for `error` and `nothing`;
    `deduplicate` is correct for any split because it keeps every live row.
    """

    def __init__(self, config: MaterializerConfig) -> None:
        self.config = config
        self._dispatch: dict[ChangeKind, Callable[[_Barrier, Change], None]] = {
            ChangeKind.INSERT: self._add,
            ChangeKind.UPDATE_AFTER: self._add,
            ChangeKind.UPDATE_BEFORE: self._retract,
            ChangeKind.DELETE: self._retract,
        }
        deciders = {"error": self._decide_error, "nothing": self._decide_nothing, "deduplicate": self._decide_latest}
        self._decide: Callable[[_Barrier, str | None], LiveRow | None] = deciders[config.on_conflict]

    def apply(self, pk: str, state: str | None, changes: Sequence[Change], now_ms: int) -> Outcome:
        """Apply `changes` (arrival order) to the state of key `pk`; with no changes only prune tombstones."""
        barrier = _Barrier(pk, self._load(pk, state), now_ms, Counters())
        emitted = barrier.state.emitted
        current_key = barrier.state.rows[-1].upsert_key if barrier.state.rows else None
        self._prune(barrier)
        for change in changes:
            self._dispatch[change.kind](barrier, change)
        winner = self._decide(barrier, current_key)
        return self._outcome(barrier, _net_change(emitted, winner))

    def _load(self, pk: str, state: str | None) -> PkState:
        if state is None:
            return PkState()
        try:
            return decode_state(state)
        except StateFormatError as exc:
            raise MaterializerError(
                f"table {self.config.table}, primary key {self._shown(pk)}: stored state: {exc}"
            ) from None

    def _prune(self, barrier: _Barrier) -> None:
        retention = self.config.tombstone_retention_ms
        if retention == 0:
            return
        tombstones = barrier.state.tombstones
        for key in [k for k, t in tombstones.items() if outlived(t.deleted_at_ms, retention, barrier.now_ms)]:
            del tombstones[key]

    def _add(self, barrier: _Barrier, change: Change) -> None:
        rows = barrier.state.rows
        index = _find(rows, change.upsert_key) if change.key_mode == "upsert_key" else None
        if change.sequence is not None and self._is_stale_add(barrier, change, index):
            return
        barrier.state.tombstones.pop(change.upsert_key, None)
        live = LiveRow(change.upsert_key, change.row, change.position, change.sequence, change.key_mode)
        if index is None:
            rows.append(live)
        else:
            rows[index] = live

    def _is_stale_add(self, barrier: _Barrier, change: Change, index: int | None) -> bool:
        newest = barrier.state.rows[index] if index is not None else None
        if newest is None or newest.sequence is None:
            newest = barrier.state.tombstones.get(change.upsert_key)
        return newest is not None and self._drop_if_older(barrier, change, newest)

    def _retract(self, barrier: _Barrier, change: Change) -> None:
        rows = barrier.state.rows
        index = _find(rows, change.upsert_key)
        if index is None:
            self._retract_missing(barrier, change)
            return
        live = rows[index]
        if change.sequence is not None and live.sequence is not None and self._drop_if_older(barrier, change, live):
            return
        if self.config.on_conflict == "deduplicate" and index == len(rows) - 1 and len(rows) > 1:
            barrier.counters.rollbacks += 1
        del rows[index]
        self._bury(barrier, change)

    def _retract_missing(self, barrier: _Barrier, change: Change) -> None:
        tombstone = barrier.state.tombstones.get(change.upsert_key)
        if change.sequence is not None and tombstone is not None and self._drop_if_older(barrier, change, tombstone):
            return
        log.warning(STATE_CLEARED_WARNING, self.config.table, self._shown(barrier.pk), change.kind.value,
                    _where(change.position))
        barrier.counters.cleared_state_warnings += 1
        self._bury(barrier, change)

    def _bury(self, barrier: _Barrier, change: Change) -> None:
        # Only the newest delete of a key matters for staleness.
        if change.sequence is None:
            return
        tombstones = barrier.state.tombstones
        known = tombstones.get(change.upsert_key)
        if known is None or not self._older(barrier, change, known):
            tombstones[change.upsert_key] = Tombstone(change.sequence, change.position, barrier.now_ms)

    def _drop_if_older(self, barrier: _Barrier, change: Change, newest: LiveRow | Tombstone) -> bool:
        if not self._older(barrier, change, newest):
            return False
        log.debug(STALE_CHANGE_MESSAGE, self.config.table, self._shown(barrier.pk), change.kind.value,
                  _where(change.position))
        barrier.counters.stale_dropped += 1
        return True

    def _older(self, barrier: _Barrier, change: Change, newest: LiveRow | Tombstone) -> bool:
        try:
            return (change.sequence, change.position) < (newest.sequence, newest.position)
        except TypeError:
            raise MaterializerError(
                f"table {self.config.table}, primary key {self._shown(barrier.pk)}: sequence_by values of "
                f"{_where(change.position)} and {_where(newest.position)} cannot be compared"
            ) from None

    def _decide_error(self, barrier: _Barrier, current_key: str | None) -> LiveRow | None:
        rows = barrier.state.rows
        if len(rows) > 1:
            raise ConflictError(self._conflict_message(barrier.pk, rows))
        return rows[0] if rows else None

    def _decide_nothing(self, barrier: _Barrier, current_key: str | None) -> LiveRow | None:
        rows = barrier.state.rows
        if not rows:
            return None
        winner = next((live for live in rows if live.upsert_key == current_key), rows[0])
        barrier.counters.conflicts += len(rows) - 1
        rows[:] = [winner]
        return winner

    def _decide_latest(self, barrier: _Barrier, current_key: str | None) -> LiveRow | None:
        rows = barrier.state.rows
        return rows[-1] if rows else None

    def _shown(self, value: str) -> str:
        return shown(value, self.config.log_values)

    def _conflict_message(self, pk: str, rows: list[LiveRow]) -> str:
        listed = [
            f"{'a whole-row key' if live.key_mode == 'whole_row' else 'upsert key ' + self._shown(live.upsert_key)} "
            f"from {_where(live.position)}"
            for live in rows[:_CONFLICT_LISTED]
        ]
        more = f"; and {len(rows) - _CONFLICT_LISTED} more" if len(rows) > _CONFLICT_LISTED else ""
        columns = ", ".join(self.config.primary_key)
        return (
            f"table {self.config.table}: primary key ({columns}) = {self._shown(pk)} has {len(rows)} live rows after "
            f"compaction (on_conflict=error): {'; '.join(listed)}{more}"
        )

    def _outcome(self, barrier: _Barrier, net: NetChange | None) -> Outcome:
        state = barrier.state
        text = encode_state(state)
        counters = barrier.counters
        counters.live_rows = len(state.rows)
        counters.tombstones = len(state.tombstones)
        counters.state_bytes = len(text.encode()) if text is not None else 0
        retention = self.config.tombstone_retention_ms
        wake = min((t.deleted_at_ms + retention for t in state.tombstones.values()), default=None)
        return Outcome(text, net, counters, wake if retention else None)


def _net_change(emitted: str | None, winner: LiveRow | None) -> NetChange | None:
    if winner is not None and winner.row != emitted:
        return NetChange("upsert", winner.row)
    if winner is None and emitted is not None:
        return NetChange("delete", None)
    return None
