"""The regular changelog join's rules, pure (no Spark, no I/O): one micro-batch of changes of both
inputs and the state before it -> the state after it and the output's net changes.

State of each side (`SIDE_SCHEMA`, one row per live input row): its primary key (`pk`, canonical
JSON), its join key (`jk`, canonical JSON; null when a join column is null: such a row never
matches), its row image and declared types (JSON text), the event time it was last touched at and
the source position of its last change. Rules, per micro-batch (the barrier):

1. Each side's changes are reduced to the last change per primary key in source order (topic,
   partition, offset, change index): Debezium keys its topics by primary key, so a key's changes sit
   in one partition; a key change (delete of the old key, create of the new one, in other partitions)
   is two keys. A retraction (-U, -D) as the last change removes the row, anything else upserts it.
2. Clock: the largest event time (the change's own, else its Kafka timestamp) read so far, from both
   inputs. Before the batch is applied, a side row not touched for at least the side's TTL
   (`touched + ttl <= clock`) is dropped: it is treated as never seen, and its expiry emits nothing.
3. Affected join keys: the old join keys of the changed rows (after expiry) and their new ones. The
   join of both sides restricted to them is computed before and after the batch (inner, or left outer:
   a left row without a match joins a row of nulls); output rows are identified by their upsert key,
   the pair (left pk, right pk).
4. Output rows of the old join missing from the new are retracted, new or changed ones added
   (retractions first), and both go through the materializer rules (`Materializer`) keyed by the
   output's declared primary key, so `on_conflict` decides when that key is not the pair. Expired
   rows are in neither join: output rows made with them stay in the table until a later change of
   their output key, but leave the materializer's live rows without a net change, so that such a
   change replaces them rather than conflicting with them (`_forget_expired`).

Output rows (columns, keys) and the materializer step: `regular_join_output`. Nothing here reads the
wall clock: a replayed batch decides the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from service.kafka_to_delta.barrier import outlived_mask
from service.kafka_to_delta.formats.debezium_json import canonical_key, compact_json
from service.kafka_to_delta.joins.regular_join_output import (
    OutputRows,
    expire_output,
    materialized,
    output_changes,
)
from service.kafka_to_delta.materialize.fill_unchanged import fill_unchanged, filled_images
from service.kafka_to_delta.materialize.key_state import decode_state, encode_state
from service.kafka_to_delta.materialize.last_change import last_rows
from service.kafka_to_delta.materialize.rules import Counters, MaterializerConfig
from service.kafka_to_delta.rows.names import Column
from vocabulary.changes import ChangeKind

SIDE_SCHEMA = pa.schema([
    ("pk", pa.string()), ("jk", pa.string()), ("row", pa.string()), ("types", pa.string()),
    ("touched", pa.int64()), ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
])
_RETRACTIONS = pa.array([ChangeKind.UPDATE_BEFORE.value, ChangeKind.DELETE.value])
_SOURCE_ORDER = [(c, "ascending") for c in (Column.TOPIC, Column.PARTITION, Column.OFFSET, Column.CHANGE_INDEX)]
_POSITION = ("topic", "partition", "offset")
_CHANGES_SCHEMA = SIDE_SCHEMA.append(pa.field("deleted", pa.bool_())).append(pa.field("unchanged", pa.string()))


@dataclass(frozen=True)
class SideRules:
    """One input: its key columns and its state TTL (0: kept until the data removes the row)."""

    primary_key: tuple[str, ...]
    join_key: tuple[str, ...]
    ttl_ms: int = 0


@dataclass(frozen=True)
class JoinRules:
    """Everything the rules need of a join's configuration."""

    left: SideRules
    right: SideRules
    outer: bool  # left outer join
    output: MaterializerConfig  # table, declared primary key, on_conflict
    output_ttl_ms: int = 0  # the materializer's state TTL (the pipeline's state_ttl_seconds)


@dataclass
class JoinState:
    """Both sides, the materializer state per output primary key ((state text, touched)) and the clock."""

    left: pa.Table = field(default_factory=SIDE_SCHEMA.empty_table)
    right: pa.Table = field(default_factory=SIDE_SCHEMA.empty_table)
    output: dict[str, tuple[str, int]] = field(default_factory=dict)
    clock: int = 0


@dataclass(frozen=True)
class SideDelta:
    """What one batch changed in a side's state: rows to store, primary keys to forget."""

    stored: pa.Table
    removed: list[str]


@dataclass(frozen=True)
class Step:
    """The result of one batch."""

    state: JoinState
    output: pa.Table  # OUTPUT_SCHEMA
    left: SideDelta
    right: SideDelta
    output_stored: dict[str, tuple[str, int]]
    output_removed: list[str]
    counters: Counters
    expired: int  # side rows dropped by their TTL


def _join_key(row: dict, columns: tuple[str, ...]) -> str | None:
    values = [row.get(c) for c in columns]
    return None if any(v is None for v in values) else canonical_key(values)


def side_changes(changelog: pa.Table, rules: SideRules) -> pa.Table:
    """A side's changelog rows (`CHANGELOG_SCHEMA` columns) -> its last change per primary key, as
    `SIDE_SCHEMA` rows plus `deleted` (row null for a delete) and `unchanged` (columns a TOAST
    placeholder left out that no earlier image of the batch held)."""
    if changelog.num_rows == 0:
        return _CHANGES_SCHEMA.empty_table()
    ordered = changelog.sort_by(_SOURCE_ORDER)
    last = filled_images(last_rows(ordered, Column.KEY), ordered)
    deleted = pc.fill_null(pc.is_in(last.column(Column.KIND), _RETRACTIONS), False)
    rows = last.column(Column.ROW).to_pylist()
    gone = deleted.to_pylist()
    keys = [None if d or r is None else _join_key(orjson.loads(r), rules.join_key) for r, d in zip(rows, gone)]
    touched = pc.coalesce(last.column(Column.EVENT_TIME), last.column(Column.TIMESTAMP))
    return pa.table({
        "pk": last.column(Column.KEY), "jk": pa.array(keys, pa.string()),
        "row": pc.if_else(deleted, pa.scalar(None, pa.string()), last.column(Column.ROW)),
        "types": last.column(Column.TYPES), "touched": pc.cast(touched, pa.int64()),
        "topic": last.column(Column.TOPIC), "partition": last.column(Column.PARTITION),
        "offset": last.column(Column.OFFSET), "deleted": deleted,
        "unchanged": pc.if_else(deleted, pa.scalar(None, pa.string()), last.column(Column.UNCHANGED)),
    })


def _expired(state: pa.Table, ttl_ms: int, clock: int) -> pa.Array:
    if not ttl_ms or state.num_rows == 0:
        return pa.array([], pa.bool_())
    return outlived_mask(state.column("touched"), ttl_ms, clock)


@dataclass(frozen=True)
class _SideStep:
    before: pa.Table  # the state after expiry, before the batch
    after: pa.Table
    old_keys: pa.Array  # join keys of the changed rows before the batch
    new_keys: pa.Array
    changed: pa.Array  # primary keys the batch touched
    delta: SideDelta
    expired: pa.Table  # the rows the TTL dropped


def _apply_side(state: pa.Table, changes: pa.Table, rules: SideRules, clock: int) -> _SideStep:
    expired = _expired(state, rules.ttl_ms, clock)
    dropped = state.schema.empty_table()
    if len(expired) and pc.any(expired).as_py():
        dropped = state.filter(expired)
        state = state.filter(pc.invert(expired))
    changed = changes.column("pk").combine_chunks()
    touched = pc.is_in(state.column("pk"), changed)
    stored = _filled_from_state(changes.filter(pc.invert(changes.column("deleted"))), state)
    after = pa.concat_tables([state.filter(pc.invert(touched)), stored])
    deleted = changes.filter(changes.column("deleted")).column("pk").to_pylist()
    return _SideStep(
        before=state, after=after, old_keys=state.filter(touched).column("jk").combine_chunks(),
        new_keys=stored.column("jk").combine_chunks(), changed=changed,
        delta=SideDelta(stored, dropped.column("pk").to_pylist() + deleted), expired=dropped,
    )


def _filled_from_state(stored: pa.Table, state: pa.Table) -> pa.Table:
    """Upserts whose TOAST-unchanged columns are taken from the row's previous image in state (a column
    no image holds stays out of the row: null in the output)."""
    partial = pc.is_valid(stored.column("unchanged"))
    if pc.any(partial).as_py():
        known = state.filter(pc.is_in(state.column("pk"), pc.filter(stored.column("pk"), partial)))
        previous = dict(zip(known.column("pk").to_pylist(), known.column("row").to_pylist()))
        texts = []
        for pk, text, unchanged in zip(*(stored.column(c).to_pylist() for c in ("pk", "row", "unchanged"))):
            if unchanged and pk in previous:
                text = compact_json(fill_unchanged(orjson.loads(text), orjson.loads(unchanged),
                                                   [{"row": previous[pk]}])[0])
            texts.append(text)
        stored = stored.set_column(stored.schema.get_field_index("row"), "row", pa.array(texts, pa.string()))
    return stored.select(SIDE_SCHEMA.names).cast(SIDE_SCHEMA)


def _joined(left: pa.Table, right: pa.Table, outer: bool) -> pa.Table:
    """Pairs of (left, right) rows with equal join keys; `outer`: unmatched left rows with nulls."""
    names = ["pk", "row", "types", *_POSITION]
    lhs = left.select(["jk", *names]).rename_columns(["jk", *(f"l_{n}" for n in names)])
    rhs = right.filter(pc.is_valid(right.column("jk"))).select(["jk", *names])
    rhs = rhs.rename_columns(["jk", *(f"r_{n}" for n in names)])
    return lhs.join(rhs, "jk", join_type="left outer" if outer else "inner", use_threads=False)


def _scope(step: _SideStep, keys: pa.Array, table: pa.Table, by_pk: bool) -> pa.Table:
    """The rows of `table` with an affected join key (left: also the changed rows, whatever their key)."""
    mask = pc.fill_null(pc.is_in(table.column("jk"), keys), False)
    if by_pk:
        mask = pc.or_(mask, pc.is_in(table.column("pk"), step.changed))
    return table.filter(mask)


def _forget_expired(state: JoinState, lstep: _SideStep, rstep: _SideStep, rows: OutputRows, rules: JoinRules,
                    output: dict[str, tuple[str, int]]) -> set[str]:
    """Take the output rows made with expired side rows out of the materializer's live rows, without
    emitting anything (the table keeps them): the join no longer knows them, so a later row of their
    output key replaces them instead of conflicting with them. Returns the output keys changed."""
    if not lstep.expired.num_rows and not rstep.expired.num_rows:
        return set()
    made = {**rows.rows(_joined(lstep.expired, state.right, rules.outer)),
            **rows.rows(_joined(state.left, rstep.expired, False))}
    by_pk: dict[str, set[str]] = {}
    for ukey, (pk, *_) in made.items():
        by_pk.setdefault(pk, set()).add(ukey)
    changed = set()
    for pk, ukeys in by_pk.items():
        if pk not in output:
            continue
        text, touched = output[pk]
        live = decode_state(text)
        live.rows = [row for row in live.rows if row.upsert_key not in ukeys]
        kept = encode_state(live)
        if kept is None:
            del output[pk]
        else:
            output[pk] = (kept, touched)
        changed.add(pk)
    return changed


def join_step(state: JoinState, left: pa.Table, right: pa.Table, rules: JoinRules) -> Step:
    """Apply one batch: `left` / `right` are the sides' `side_changes`."""
    moments = [m for m in (pc.max(left.column("touched")).as_py(), pc.max(right.column("touched")).as_py())
               if m is not None]
    clock = max([state.clock, *moments])
    lstep = _apply_side(state.left, left, rules.left, clock)
    rstep = _apply_side(state.right, right, rules.right, clock)
    keys = pa.concat_arrays([lstep.old_keys, lstep.new_keys, rstep.old_keys, rstep.new_keys]).unique().drop_null()
    old = _joined(_scope(lstep, keys, lstep.before, True), _scope(rstep, keys, rstep.before, False), rules.outer)
    new = _joined(_scope(lstep, keys, lstep.after, True), _scope(rstep, keys, rstep.after, False), rules.outer)
    rows = OutputRows(rules.output.primary_key)
    output_state = dict(state.output)
    expired_out = expire_output(output_state, rules.output_ttl_ms, clock)
    for pk in expired_out:
        del output_state[pk]
    forgotten = _forget_expired(state, lstep, rstep, rows, rules, output_state)
    net, stored, removed, counters = materialized(rules.output, output_state,
                                                   output_changes(rows.rows(old), rows.rows(new)), clock)
    output_state.update(stored)
    for pk in removed:
        del output_state[pk]
    changed = forgotten | stored.keys() | set(removed) | set(expired_out)
    after = replace(state, left=lstep.after, right=rstep.after, output=output_state, clock=clock)
    return Step(after, net, lstep.delta, rstep.delta, {pk: output_state[pk] for pk in changed if pk in output_state},
                sorted(pk for pk in changed if pk not in output_state), counters,
                lstep.expired.num_rows + rstep.expired.num_rows)
