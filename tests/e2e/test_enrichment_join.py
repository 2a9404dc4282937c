"""The snapshot-gated enrichment join end to end: the broker, the shared Spark session, Delta.

Orders (the probe input, plain JSON keyed by order id) are in Kafka before the customers'
Debezium snapshot (the build input, three partitions) is. Two joins read the same topics at the
same moments: one with the gate, one without (the negative control). The gated one is
restarted in the middle of the snapshot and emits nothing until the snapshot is complete, then
every order is joined with its customer; the ungated one joined the orders with nothing.
"""

from __future__ import annotations

import json

import pytest
from deltalake import DeltaTable

from service.joins.enrichment_join import EnrichmentJoinPipeline
from service.joins.enrichment_state import GateLog, HeldProbes
from service.settings import settings_from_mapping
from service.workload import Event, create_topics, produce

pytestmark = pytest.mark.slow

CUSTOMERS = list(range(1, 31))
ORDERS = list(range(100, 140))
BUILD_PARTITIONS = 3


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


def _settings(bootstrap: str, workdir, orders: str, customers: str):
    def join(name: str, gate: bool) -> dict:
        return {
            "type": "enrichment", "name": name, "table": name, "primary_key": ["order_id"], "gate": gate,
            "max_offsets_per_trigger": 25,
            "left": {"topics": [orders], "from_changelog": {"preset": "upsert-kafka"},
                     "primary_key": ["order_id"], "join_key": ["customer_id"]},
            "right": {"topics": [customers], "primary_key": ["id"], "join_key": ["id"]},
        }

    return settings_from_mapping({
        "kafka": {"bootstrap_servers": bootstrap},
        "lakehouse": {"root": str(workdir / "tables")},
        "checkpoint_root": str(workdir / "checkpoints"),
        "joins": [join("gated", True), join("ungated", False)],
    })


def _run_until_idle(spark, settings) -> list[EnrichmentJoinPipeline]:
    """Both joins, each with a new pipeline on its checkpoint (a restart), run to the end of what is there."""
    pipelines = [EnrichmentJoinPipeline(spark, settings, join) for join in settings.joins]
    queries = [pipeline.start(until_idle=True) for pipeline in pipelines]
    for pipeline, query in zip(pipelines, queries):
        query.awaitTermination(300)
        pipeline.close()
        assert pipeline.failure is None and query.exception() is None, (pipeline.failure, query.exception())
    return pipelines


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
    orders, customers = f"orders-{unique}", f"customers-{unique}"
    create_topics(kafka_bootstrap, [orders], 2)
    create_topics(kafka_bootstrap, [customers], BUILD_PARTITIONS)
    settings = _settings(kafka_bootstrap, workdir, orders, customers)
    produce(kafka_bootstrap, _order_events(orders, ORDERS))

    # 1. Only the orders are in Kafka: the gated join holds them all; the ungated one emits them unjoined.
    _run_until_idle(spark, settings)
    assert _output(settings, "gated") is None
    assert not _gate(settings, "gated").open
    held = HeldProbes(f"{settings.checkpoint_dir('gated')}/enrichment/held", None)
    assert held.count() == len(ORDERS)

    # 2. Restart in the middle of the snapshot: two thirds of it (no `last` yet) are in Kafka.
    snapshot = _snapshot(customers)
    produce(kafka_bootstrap, snapshot[:20])
    _run_until_idle(spark, settings)
    assert _output(settings, "gated") is None, "nothing is emitted before the snapshot is complete"
    gate = _gate(settings, "gated")
    assert not gate.open and gate.read_to and held.count() == len(ORDERS)

    # 3. The rest of the snapshot, streaming changes and more orders; restart again.
    produce(kafka_bootstrap, snapshot[20:] + _streaming(customers))
    late_orders = list(range(140, 146))
    produce(kafka_bootstrap, _order_events(orders, late_orders))
    _run_until_idle(spark, settings)
    gate = _gate(settings, "gated")
    assert gate.open and gate.opened_in_batch is not None and held.count() == 0

    gated = _output(settings, "gated")
    assert sorted(gated) == ORDERS + late_orders
    for order, row in gated.items():
        cid = _customer_of(order)
        assert row["id"] == cid and row["customer_id"] == cid, row
        assert row["name"] in {_customer(cid)["name"], _customer(cid, 2)["name"]}, row  # the snapshot row or later
        assert row["city"] == _customer(cid)["city"] and row["item"] == f"item-{order}"

    # The negative control: the same orders, read before the snapshot, found no customer.
    ungated = _output(settings, "ungated")
    assert sorted(ungated) == ORDERS + late_orders
    missed = [order for order, row in ungated.items() if row.get("id") is None]
    assert set(ORDERS) <= set(missed), "without the gate the early orders miss the snapshot"

    # 4. A restart with the gate open: it stays open, a new order joins at once.
    produce(kafka_bootstrap, _order_events(orders, [146]))
    _run_until_idle(spark, settings)
    assert _gate(settings, "gated").opened_in_batch == gate.opened_in_batch
    row = _output(settings, "gated")[146]
    assert row["name"] == _customer(_customer_of(146))["name"] and row["id"] == _customer_of(146)
