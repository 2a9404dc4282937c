"""The enrichment join's state, kept in its checkpoint directory as three small Delta tables
(delta-rs), each commit carrying the micro-batch id as its application transaction so that a
replayed batch finds its own writes and skips them:

- `enrichment/build`: the latest row per build join key (`key`, `row` JSON, `types` JSON, and
  `updated_ms`, when it was written: with `state_ttl_seconds`, a row not written for that long is
  treated as never seen, and removed);
- `enrichment/held`: the probe records held back while the gate is closed, as read from Kafka;
- `enrichment/gate`: the gate state after each batch it changed (`batch_id`, `state` JSON).

The gate state of batch b, once written, is what any replay of b uses: the decision to hold or
to emit a batch never changes after a restart.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from connectors.delta.delta_rs import DeltaRsTable
from connectors.kafka.range_reader import RAW_SCHEMA
from service.kafka_to_delta.joins.enrichment_rows import BUILD_STATE_SCHEMA
from service.kafka_to_delta.joins.snapshot_gate import GateState

STATE_APP_ID = "cdc-lakehouse/enrichment-state"
BUILD_TABLE_SCHEMA = BUILD_STATE_SCHEMA.append(pa.field("updated_ms", pa.int64()))
GATE_SCHEMA = pa.schema([("batch_id", pa.int64()), ("state", pa.string())])


def _commit(batch_id: int) -> CommitProperties:
    return CommitProperties(app_transactions=[Transaction(STATE_APP_ID, int(batch_id))])


class _StateTable(DeltaRsTable):
    """One state table; `done(b)` tells whether batch b already wrote it."""

    def opened(self) -> DeltaTable | None:
        """The table at its latest version, or None before its first write."""
        return self._open()

    def done(self, batch_id: int) -> bool:
        last = self.last_batch(STATE_APP_ID)
        return last is not None and last >= batch_id

    def append(self, rows: pa.Table, batch_id: int) -> None:
        write_deltalake(self.uri, rows, mode="append", storage_options=self.storage_options,
                        commit_properties=_commit(batch_id))


class BuildState(_StateTable):
    """The latest row per build join key."""

    def rows(self, keys: Sequence[str], live_since_ms: int | None = None) -> dict[str, tuple[str, str | None]]:
        """join key text -> (row JSON, types JSON) of the keys that have a row (written at or after
        `live_since_ms`, when given: older rows have expired)."""
        table = self.opened()
        if table is None or not keys:
            return {}
        # Files written by MERGE hold string_view statistics: compare as string, not through the statistics.
        wanted = pc.field("key").cast(pa.string()).isin(pa.array(list(keys), pa.string()))
        if live_since_ms is not None:
            wanted = wanted & (pc.field("updated_ms") >= live_since_ms)
        found = table.to_pyarrow_dataset().to_table(filter=wanted, columns=BUILD_STATE_SCHEMA.names)
        found = found.cast(BUILD_STATE_SCHEMA)
        return {k: (r, t) for k, r, t in zip(*(found.column(c).to_pylist() for c in BUILD_STATE_SCHEMA.names))}

    def size(self) -> int:
        """How many keys have a row."""
        table = self.opened()
        return 0 if table is None else table.to_pyarrow_dataset().count_rows()

    def apply(self, changes: pa.Table, batch_id: int, now_ms: int) -> None:
        """Upsert / delete (`BUILD_CHANGES_SCHEMA`), written at `now_ms`, unless batch `batch_id` already did."""
        if changes.num_rows == 0 or self.done(batch_id):
            return
        table = self.opened()
        if table is None:
            DeltaTable.create(self.uri, BUILD_TABLE_SCHEMA, mode="ignore", storage_options=self.storage_options)
            table = self.opened()
            assert table is not None
        changes = changes.append_column("updated_ms", pa.array([now_ms] * changes.num_rows, pa.int64()))
        columns = {c: f"s.{c}" for c in BUILD_TABLE_SCHEMA.names}
        (
            table.merge(changes, "t.key = s.key", source_alias="s", target_alias="t",
                        commit_properties=_commit(batch_id))
            .when_matched_delete(predicate="s.deleted")
            .when_matched_update(updates=columns, predicate="NOT s.deleted")
            .when_not_matched_insert(updates=columns, predicate="NOT s.deleted")
            .execute()
        )

    def expire(self, live_since_ms: int, batch_id: int) -> int:
        """Remove the rows written before `live_since_ms` (a state TTL); returns how many there were."""
        table = self.opened()
        if table is None:
            return 0
        expired = table.to_pyarrow_dataset().count_rows(filter=pc.field("updated_ms") < live_since_ms)
        if expired:
            table.delete(f"updated_ms < {int(live_since_ms)}", commit_properties=_commit(batch_id))
        return expired


class HeldProbes(_StateTable):
    """Probe records (`RAW_SCHEMA`) read while the gate was closed."""

    def hold(self, records: pa.Table, batch_id: int) -> None:
        """Append a batch's probe records unless that batch already did."""
        if records.num_rows and not self.done(batch_id):
            self.append(records.select(RAW_SCHEMA.names).cast(RAW_SCHEMA), batch_id)

    def all(self) -> pa.Table:
        """Every held record (`RAW_SCHEMA`), in source order (topic, partition, offset)."""
        table = self.opened()
        if table is None:
            return RAW_SCHEMA.empty_table()
        order = [("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")]
        return table.to_pyarrow_table().cast(RAW_SCHEMA).sort_by(order)

    def count(self) -> int:
        """How many records are held."""
        table = self.opened()
        return 0 if table is None else table.to_pyarrow_dataset().count_rows()

    def clear(self, batch_id: int) -> None:
        """Remove every held record (after batch `batch_id` emitted them) unless that batch already did."""
        table = self.opened()
        if table is not None and not self.done(batch_id):
            table.delete(commit_properties=_commit(batch_id))


class GateLog(_StateTable):
    """The gate state after each batch that changed it."""

    def state_for(self, batch_id: int) -> tuple[GateState, bool]:
        """(state, written): the state batch `batch_id` wrote (a replay), else the latest before it."""
        table = self.opened()
        if table is None:
            return GateState(), False
        rows = table.to_pyarrow_dataset().to_table(filter=pc.field("batch_id") <= batch_id)
        if rows.num_rows == 0:
            return GateState(), False
        latest = rows.sort_by([("batch_id", "descending")]).slice(0, 1).to_pylist()[0]
        return GateState.from_json(latest["state"]), latest["batch_id"] == batch_id

    def record(self, state: GateState, batch_id: int) -> None:
        """Keep the state batch `batch_id` left, unless that batch already did."""
        if not self.done(batch_id):
            self.append(pa.table({"batch_id": [batch_id], "state": [state.to_json()]}, schema=GATE_SCHEMA), batch_id)
