"""The regular join's state, kept as one Delta table inside the join's checkpoint directory.

One table, so that a batch's whole state change is one atomic commit: a row per live input row
of each side (`side` left / right, the `SIDE_SCHEMA` columns), a row per output primary key the
materializer remembers (`side` output: `row` holds the rules' state text), and the clock (`side`
clock). Each commit carries the batch id as its application transaction, like the output's.

Commit order, enforced by the pipeline: the output MERGE first, then this table. A crash between
the two replays the batch from the old state: the output is skipped (already committed), the state
is computed again from the same input and committed. A crash after both skips the batch.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from connectors.delta.delta_rs import DELETE_FLAG, DeltaRsTable
from service.kafka_to_delta.joins.regular_join_rules import SIDE_SCHEMA, JoinState, SideDelta, Step

LEFT, RIGHT, OUTPUT, CLOCK = "left", "right", "output", "clock"
STORE_SCHEMA = pa.schema([pa.field("side", pa.string()), *SIDE_SCHEMA])
_KEY = ("side", "pk")
TIDY_EVERY_BATCHES = 100


def state_uri(checkpoint_dir: str) -> str:
    """Where a join keeps its state: inside its checkpoint, so both go together."""
    return f"{checkpoint_dir.rstrip('/')}/join_state"


def _tagged(side: str, rows: pa.Table, deleted: bool) -> pa.Table:
    columns = {name: rows.column(name) if name in rows.column_names else pa.nulls(rows.num_rows, field.type)
               for name, field in zip(SIDE_SCHEMA.names, SIDE_SCHEMA)}
    table = pa.table({"side": pa.array([side] * rows.num_rows, pa.string()), **columns}, schema=STORE_SCHEMA)
    return table.append_column(DELETE_FLAG, pa.array([deleted] * rows.num_rows, pa.bool_()))


def _removed(side: str, pks: list[str], stored: set[str]) -> pa.Table:
    gone = sorted(set(pks) - stored)  # an expired key stored again in the same batch is stored
    return _tagged(side, pa.table({"pk": pa.array(gone, pa.string())}), deleted=True)


def _side_changes(side: str, delta: SideDelta) -> list[pa.Table]:
    stored = delta.stored.select(SIDE_SCHEMA.names)
    return [_tagged(side, stored, False), _removed(side, delta.removed, set(stored.column("pk").to_pylist()))]


def _output_changes(stored: dict[str, tuple[str, int]], removed: list[str]) -> list[pa.Table]:
    keys = sorted(stored)
    rows = pa.table({"pk": pa.array(keys, pa.string()), "row": pa.array([stored[k][0] for k in keys], pa.string()),
                     "touched": pa.array([stored[k][1] for k in keys], pa.int64())})
    return [_tagged(OUTPUT, rows, False), _removed(OUTPUT, removed, set(keys))]


class JoinStateStore:
    """Loads and commits a join's state (one Delta table, delta-rs)."""

    def __init__(self, uri: str, storage_options: dict[str, str] | None = None) -> None:
        self.table = DeltaRsTable(uri, storage_options)

    def committed(self, app_id: str, batch_id: int) -> bool:
        """True when this batch's state is already stored (a replay after both commits)."""
        last = self.table.last_batch(app_id)
        return last is not None and last >= batch_id

    def load(self) -> JoinState:
        """The state as last committed (empty when there is none yet)."""
        if self.table.schema() is None:
            return JoinState()
        stored = DeltaTable(self.table.uri, storage_options=self.table.storage_options).to_pyarrow_table()
        stored = pa.table([stored.column(f.name).cast(f.type) for f in STORE_SCHEMA], schema=STORE_SCHEMA)

        def side(name: str) -> pa.Table:
            return stored.filter(pc.equal(stored.column("side"), name)).drop_columns(["side"])

        output = side(OUTPUT).to_pylist()
        clock = side(CLOCK).column("touched").to_pylist()
        return JoinState(left=side(LEFT), right=side(RIGHT),
                         output={r["pk"]: (r["row"], r["touched"]) for r in output}, clock=clock[0] if clock else 0)

    def commit(self, step: Step, app_id: str, batch_id: int) -> None:
        """Store what `step` changed, in one Delta commit carrying the batch id."""
        clock = pa.table({"pk": [""], "touched": pa.array([step.state.clock], pa.int64())})
        changes = pa.concat_tables([
            *_side_changes(LEFT, step.left), *_side_changes(RIGHT, step.right),
            *_output_changes(step.output_stored, step.output_removed), _tagged(CLOCK, clock, False),
        ])
        if self.table.schema() is None:  # no change data feed: nobody reads this table's changes
            DeltaTable.create(self.table.uri, STORE_SCHEMA, mode="ignore", storage_options=self.table.storage_options)
        self.table.merge(changes, _KEY, app_id, batch_id)

    def tidy(self) -> None:
        """Compact the table and delete the files its latest version does not use."""
        table = DeltaTable(self.table.uri, storage_options=self.table.storage_options)
        table.optimize.compact()
        table.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)
