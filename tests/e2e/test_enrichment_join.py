"""The snapshot-gated enrichment join end to end: the broker, the shared Spark session, Delta.

Orders (the probe input, plain JSON keyed by order id) are in Kafka before the customers'
Debezium snapshot (the build input, three partitions) is. Two joins read the same topics at the
same moments: one with the gate (orders whose customer does not exist are dead-lettered), one
without (the negative control; such orders get null customer columns). The gated one is
restarted in the middle of the snapshot and emits nothing until the snapshot is complete, then
every order is joined with its customer; the ungated one joined the orders with nothing.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from connectors.kafka.offsets import to_map
from connectors.kafka.range_reader import RAW_SCHEMA
from service.config.dead_letters import DEFAULT_POSITIONS_TOPIC
from service.config.settings import settings_from_mapping
from service.kafka_to_delta.joins.enrichment_join import MISSING_STAGE, EnrichmentJoinPipeline
from service.kafka_to_delta.joins.enrichment_state import GateLog, HeldProbes
from service.kafka_to_delta.sink.dead_letters import DlqHeader
from service.operations.workload import Event, create_topics, produce
from service.supervisor.runner import Runner
from tests.support.export_driver import consume

pytestmark = pytest.mark.slow

CUSTOMERS = list(range(1, 31))
ORDERS = list(range(100, 140))
BUILD_PARTITIONS = 3
ORPHAN = 199  # an order whose customer (99) never exists


def _customer(cid: int, version: int = 1) -> dict:
    return {"id": cid, "name": f"customer-{cid}-v{version}", "city": f"city-{cid % 4}"}


def _customer_of(order: int) -> int:
    return order % 28 + 1  # customers 29 and 30 have no order


def _order_events(topic: str, orders: list[int]) -> list[Event]:
    return [Event(topic, order % 2, json.dumps({"order_id": order}).encode(),
                  json.dumps({"order_id": order, "customer_id": _customer_of(order), "item": f"item-{order}"}).encode())
            for order in orders]


def _change(topic: str, cid: int, op: str, snapshot: str, before: dict | None, after: dict | None) -> Event:
    value = {"op": op, "before": before, "after": after, "source": {"snapshot": snapshot, "table": "customers"}}
    return Event(topic, cid % BUILD_PARTITIONS, json.dumps({"id": cid}).encode(), json.dumps(value).encode())


def _snapshot(topic: str) -> list[Event]:
    marks = ["first"] + ["true"] * (len(CUSTOMERS) - 2) + ["last"]
    return [_change(topic, cid, "r", mark, None, _customer(cid)) for cid, mark in zip(CUSTOMERS, marks)]


def _streaming(topic: str) -> list[Event]:
    updates = [_change(topic, cid, "u", "false", _customer(cid), _customer(cid, 2)) for cid in (1, 2, 3, 4, 5)]
    inserts = [_change(topic, cid, "c", "false", None, _customer(cid)) for cid in (31, 32)]
    return updates + inserts + [_change(topic, 30, "d", "false", _customer(30), None)]


def _orphan(topic: str) -> Event:
    return Event(topic, 0, json.dumps({"order_id": ORPHAN}).encode(),
                 json.dumps({"order_id": ORPHAN, "customer_id": 99, "item": "lost"}).encode())


def _settings(bootstrap: str, workdir, orders: str, customers: str, dlq: str, only: str | None = None):
    def join(name: str, gate: bool, **missing: str) -> dict:
        return {
            "type": "enrichment", "name": name, "table": name, "primary_key": ["order_id"], "gate": gate, **missing,
            "max_offsets_per_trigger": 25,
            "left": {"topics": [orders], "from_changelog": {"preset": "upsert-kafka"},
                     "primary_key": ["order_id"], "join_key": ["customer_id"]},
            "right": {"topics": [customers], "primary_key": ["id"], "join_key": ["id"]},
        }

    return settings_from_mapping({
        "kafka": {"bootstrap_servers": bootstrap},
        "lakehouse": {"root": str(workdir / "tables")},
        "checkpoint_root": str(workdir / "checkpoints"),
        "joins": [j for j in (join("gated", True, missing="dead_letter", dead_letter_topic=dlq),
                              join("ungated", False, missing="nulls")) if only in (None, j["name"])],
    })


def _run_until_idle(spark, settings) -> list[EnrichmentJoinPipeline]:
    """Every join, each a new pipeline on its checkpoint (a restart), run to the end of what is in Kafka
    now; the queries run together, started one after the other (each source's planner connects back)."""
    pipelines = [EnrichmentJoinPipeline(spark, settings, join) for join in settings.joins]
    queries = []
    for pipeline in pipelines:
        query = pipeline.start(until_idle=True)
        deadline = time.monotonic() + 120
        while query.isActive and query.status["message"] == "Initializing sources" and time.monotonic() < deadline:
            time.sleep(0.1)
        queries.append(query)
    for pipeline, query in zip(pipelines, queries):
        query.awaitTermination(300)
        pipeline.close()
        assert pipeline.failure is None and query.exception() is None, (pipeline.failure, query.exception())
    return pipelines


def _run_by_the_runner(settings) -> list[EnrichmentJoinPipeline]:
    """The joins run by the service's runner (in this process, on the shared Spark session) until idle."""
    runner = Runner(settings)
    runner.start(until_idle=True)
    runner.wait()  # raises a pipeline's terminal error
    assert all(entry.failures == 0 for entry in runner.supervised)
    return runner.pipelines  # type: ignore[return-value]


def _output(settings, name: str) -> dict[int, dict] | None:
    try:
        table = DeltaTable(settings.lakehouse.table_uri(name))
    except Exception:  # noqa: BLE001 - not created yet
        return None
    return {row["order_id"]: row for row in table.to_pyarrow_table().to_pylist()}


def _gate(settings, name: str):
    state, _ = GateLog(f"{settings.checkpoint_dir(name)}/enrichment/gate", None).state_for(10**9)
    return state


def test_the_gate_holds_orders_until_the_customer_snapshot_is_complete(spark, kafka_bootstrap, unique, workdir):
    orders, customers, dlq = f"orders-{unique}", f"customers-{unique}", f"missing-{unique}"
    create_topics(kafka_bootstrap, [orders], 2)
    create_topics(kafka_bootstrap, [customers], BUILD_PARTITIONS)
    create_topics(kafka_bootstrap, [dlq, DEFAULT_POSITIONS_TOPIC], 1)
    settings = _settings(kafka_bootstrap, workdir, orders, customers, dlq)
    produce(kafka_bootstrap, _order_events(orders, ORDERS))  # before any customer is in Kafka

    # 1. Two thirds of the snapshot (no `last` yet) are in Kafka: the gated join holds every order and
    # emits nothing; the ungated one emits them, those of customers 21..28 (not in Kafka yet) unjoined.
    snapshot = _snapshot(customers)
    produce(kafka_bootstrap, snapshot[:20])
    first = _run_until_idle(spark, settings)
    assert _output(settings, "gated") is None, "nothing is emitted before the snapshot is complete"
    gate = _gate(settings, "gated")
    held = HeldProbes(f"{settings.checkpoint_dir('gated')}/enrichment/held", None)
    assert not gate.open and gate.read_to and held.count() == len(ORDERS)
    unseen = [order for order in ORDERS if _customer_of(order) > 20]
    assert first[0].missing_total == 0 and first[1].missing_total >= len(unseen)

    # 2. The rest of the snapshot, streaming changes and more orders; restart again.
    produce(kafka_bootstrap, snapshot[20:] + _streaming(customers))
    late_orders = list(range(140, 146))
    produce(kafka_bootstrap, _order_events(orders, late_orders) + [_orphan(orders)])
    pipelines = _run_until_idle(spark, settings)
    gate = _gate(settings, "gated")
    assert gate.open and gate.opened_in_batch is not None and held.count() == 0

    gated = _output(settings, "gated")
    assert sorted(gated) == ORDERS + late_orders  # the orphan was dead-lettered
    for order, row in gated.items():
        cid = _customer_of(order)
        assert row["id"] == cid and row["customer_id"] == cid, row
        assert row["name"] in {_customer(cid)["name"], _customer(cid, 2)["name"]}, row  # the snapshot row or later
        assert row["city"] == _customer(cid)["city"] and row["item"] == f"item-{order}"

    # The negative control: orders read before their customer's snapshot row stay without it (missing: nulls).
    ungated = _output(settings, "ungated")
    assert sorted(ungated) == ORDERS + late_orders + [ORPHAN] and ungated[ORPHAN]["id"] is None
    missed = {order for order, row in ungated.items() if row.get("id") is None}
    assert set(unseen) <= missed, "without the gate the early orders miss the snapshot"

    # The orphan went to the dead-letter topic as read.
    assert [p.missing_total for p in pipelines] == [1, 1]  # this run: the orphan only
    (key, value, headers), = consume(kafka_bootstrap, dlq)
    assert (key, value) == (_orphan(orders).key, _orphan(orders).value)
    assert dict(headers)[DlqHeader.STAGE] == MISSING_STAGE.encode()

    # 3. A restart of the gated join with the gate open, by the service's runner: it stays open, a new
    # order joins at once.
    produce(kafka_bootstrap, _order_events(orders, [146]))
    only_gated = _settings(kafka_bootstrap, workdir, orders, customers, dlq, only="gated")
    assert [p.committed_batches for p in _run_by_the_runner(only_gated)] == [1]
    assert _gate(settings, "gated").opened_in_batch == gate.opened_in_batch
    row = _output(settings, "gated")[146]
    assert row["name"] == _customer(_customer_of(146))["name"] and row["id"] == _customer_of(146)


def _batch(spark, events: list[Event]):
    """One micro-batch's Kafka records as the source gives them to foreachBatch."""
    now = datetime.now(timezone.utc)
    offsets: dict[tuple[str, int], int] = {}
    rows: list[tuple] = []
    for event in events:
        offset = offsets.get((event.topic, event.partition), 0)
        offsets[(event.topic, event.partition)] = offset + 1
        rows.append((event.key, event.value, event.topic, event.partition, offset, now, []))
    table = pa.Table.from_pylist([dict(zip(RAW_SCHEMA.names, r)) for r in rows], schema=RAW_SCHEMA)
    return spark.createDataFrame(table)


def _offset_log(checkpoint: str, batch_id: int, ends: dict[tuple[str, int], int]) -> None:
    """The entry Spark writes in the offset log before it runs batch `batch_id`."""
    path = Path(checkpoint) / "offsets" / str(batch_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(["v1", "{}", json.dumps(to_map(ends))]))


def _replayable(spark, settings, name: str) -> EnrichmentJoinPipeline:
    pipeline = EnrichmentJoinPipeline(spark, settings, next(j for j in settings.joins if j.name == name))
    pipeline._query_id = "query-1"  # as `start` sets it from the checkpoint's query id
    pipeline._started.set()
    pipeline._end_offsets = lambda topic: {p: 10 for p in range(BUILD_PARTITIONS)}  # type: ignore[method-assign]
    return pipeline


def test_last_waits_for_every_partition_a_replay_changes_nothing_a_crash_loses_nothing(spark, unique, workdir,
                                                                                        monkeypatch):
    orders, customers = f"orders-{unique}", f"customers-{unique}"
    settings = _settings("localhost:1", workdir, orders, customers, f"missing-{unique}")
    checkpoint = settings.checkpoint_dir("gated")
    snapshot = _snapshot(customers)
    # batch 0: the orders and customers 1..10; batch 1: the rest of the snapshot, `last` (customer 30,
    # partition 0) included, but for partition 1, which batch 2 reads (ten customers a partition)
    rest = snapshot[10:]
    batch0 = _batch(spark, _order_events(orders, ORDERS[:6]) + snapshot[:10])
    batch1 = _batch(spark, [e for e in rest if e.partition != 1])
    batch2 = _batch(spark, [e for e in rest if e.partition == 1])
    everything = {(customers, p): 10 for p in range(BUILD_PARTITIONS)}
    read = {(orders, 0): 3, (orders, 1): 3}
    _offset_log(checkpoint, 0, {**read, (customers, 0): 3, (customers, 1): 4, (customers, 2): 3})
    _offset_log(checkpoint, 1, {**read, **everything, (customers, 1): 4})
    _offset_log(checkpoint, 2, {**read, **everything})

    pipeline = _replayable(spark, settings, "gated")
    pipeline.process_batch(batch0, 0)
    pipeline.process_batch(batch0, 0)  # a replay
    held = HeldProbes(f"{checkpoint}/enrichment/held", None)
    assert held.count() == 6 and _output(settings, "gated") is None and not _gate(settings, "gated").open
    pipeline.process_batch(batch1, 1)  # `last` is read, partition 1 is not read to where it ended then
    gate = _gate(settings, "gated")
    assert not gate.open and gate.waiting_for([customers]) == [f"{customers}/1"]
    assert held.count() == 6 and _output(settings, "gated") is None

    # batch 2 opens the gate; the process dies after the output commit, before the held records are cleared
    def crash(self, batch_id):
        raise RuntimeError("killed between the output commit and the clearing of the held records")

    with monkeypatch.context() as patched:
        patched.setattr(HeldProbes, "clear", crash)
        with pytest.raises(RuntimeError, match="killed"):
            pipeline.process_batch(batch2, 2)
    output_uri = settings.lakehouse.table_uri("gated")
    version = DeltaTable(output_uri).version()
    assert held.count() == 6 and _gate(settings, "gated").opened_in_batch == 2

    restarted = _replayable(spark, settings, "gated")  # a new process replays batch 2
    restarted.process_batch(batch2, 2)
    restarted.process_batch(batch2, 2)
    assert DeltaTable(output_uri).version() == version, "the output of batch 2 was committed once"
    assert held.count() == 0 and _gate(settings, "gated").opened_in_batch == 2
    joined = _output(settings, "gated")
    assert sorted(joined) == ORDERS[:6]
    assert all(row["name"] == _customer(_customer_of(order))["name"] for order, row in joined.items())
