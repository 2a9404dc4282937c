"""The regular join's state store and output sink with delta-rs (no Spark): a crash between the output
commit and the state commit, or after both, replays a batch without changing the result."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable

from connectors.delta.delta_rs import DeltaRsTable
from service.kafka_to_delta.joins.join_state import JoinStateStore, state_uri
from service.kafka_to_delta.joins.regular_join_rules import JoinState, join_step, side_changes
from service.kafka_to_delta.sink.merge_sink import MergeSink
from tests.support.join_reference import normalized
from tests.unit.service.kafka_to_delta.joins.test_regular_join_rules import (
    _SCHEMA,
    COLUMNS,
    Run,
    customer,
    order,
    rules,
)

APP = "cdc-lakehouse/j/out/query"


def _step(run: Run, state: JoinState, left: list[dict], right: list[dict]):
    return join_step(state, side_changes(pa.Table.from_pylist(left, _SCHEMA), run.rules.left),
                     side_changes(pa.Table.from_pylist(right, _SCHEMA), run.rules.right), run.rules)


def test_a_batch_replayed_after_a_crash_between_or_after_the_commits_changes_nothing(tmp_path):
    run = Run(rules(outer=True, right_ttl=10_000))
    store = JoinStateStore(state_uri(str(tmp_path / "checkpoint")))
    sink = MergeSink(DeltaRsTable(str(tmp_path / "out")), ("order_id",))
    batches = [
        ([run.change("o", "+I", 1, order(1, 7), 0), run.change("o", "+I", 2, order(2, 8), 0)],
         [run.change("c", "+I", 7, customer(7, "ann"), 0)]),
        ([run.change("o", "+U", 2, order(2, 7), 1_000)], [run.change("c", "+I", 8, customer(8, "bo"), 1_000)]),
        ([run.change("o", "+I", 3, order(3, 8), 30_000)], [run.change("c", "-D", 7, None, 30_000)]),
    ]
    for batch_id, (left, right) in enumerate(batches):
        step = _step(run, store.load(), left, right)
        sink.apply(step.output, APP, batch_id)
        if batch_id == 1:  # killed before the state commit: the batch is replayed from the stored state
            step = _step(run, store.load(), left, right)
            assert sink.apply(step.output, APP, batch_id).skipped_replay
        store.commit(step, APP, batch_id)
        assert store.committed(APP, batch_id)  # killed after both: the batch is skipped
    files = len(list((tmp_path / "checkpoint" / "join_state").glob("*.parquet")))
    store.tidy()
    assert len(list((tmp_path / "checkpoint" / "join_state").glob("*.parquet"))) < files
    assert store.committed(APP, 2) and not store.committed(APP, 3)  # tidying keeps the transactions
    loaded = store.load()
    assert loaded.clock == 30_000 and loaded.output.keys() == step.state.output.keys()
    assert sorted(loaded.left.column("pk").to_pylist()) == ["[1]", "[2]", "[3]"]
    assert loaded.right.column("pk").to_pylist() == []  # both customers expired (TTL 10 s) by the clock at 30 s
    rows = DeltaTable(str(tmp_path / "out")).to_pyarrow_table().to_pylist()
    # Customer 7 expired before its delete arrived: the delete found nothing and the rows made with it
    # stay (expiry retracts nothing); 8 expired before order 3 arrived: order 3 joins nulls.
    expected = [(1, 7, 10, 7, "ann"), (2, 7, 10, 7, "ann"), (3, 8, 10, None, None)]
    assert normalized(rows, COLUMNS) == expected
