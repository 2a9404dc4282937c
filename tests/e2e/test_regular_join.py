"""Regular changelog joins through the broker, Spark and Delta: Debezium envelopes of orders and
customers produced to Kafka -> the service's runner (`run --until-idle`) -> the Delta output tables
read back with deltalake, compared with the join of the final source tables (a dict replay).

The workload has inserts, updates and deletes on both sides (with tombstones), orders moving between
customers, primary-key changes (delete of the old key and create of the new one, in other partitions)
and cross-partition disorder (the partitions' records interleaved at random, so an order often
arrives before its customer); small micro-batches split it. The second run dies once between a
batch's output commit and its state commit, and is restarted from its checkpoint by the runner. The TTL test runs in data time: the
clock is the records' Kafka timestamps.
"""

from __future__ import annotations

import json
import random
import time
import zlib
from pathlib import Path

import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable

from connectors.delta.delta_rs import DeltaWriteError
from service.config.settings import settings_from_mapping
from service.kafka_to_delta.joins.join_state import JoinStateStore
from service.kafka_to_delta.plan.compiled_plan import apply_plan, compile_plan, read_plan
from service.operations.workload import create_topics
from service.supervisor.runner import Runner
from tests.support.join_reference import normalized, reference_join

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

T0 = (int(time.time()) // 60 - 180) * 60_000  # recent: the broker's retention goes by record timestamps
COLUMNS = ("order_id", "customer_id", "amount", "customer_id0", "name")
MINUTE = 60_000


class Source:
    """One captured table: its Debezium records (partition by key) and its current rows."""

    def __init__(self, topic: str, key: str, partitions: int) -> None:
        self.topic, self.key, self.partitions = topic, key, partitions
        self.rows: dict[int, dict] = {}
        self.records: list[tuple[int, bytes, bytes | None, int]] = []  # partition, key, value, timestamp

    def _emit(self, pk: int, op: str, before: dict | None, after: dict | None, ts: int) -> None:
        raw_key = json.dumps({self.key: pk}).encode()
        partition = zlib.crc32(raw_key) % self.partitions
        value = json.dumps({"before": before, "after": after, "op": op, "ts_ms": ts}).encode()
        self.records.append((partition, raw_key, value, ts))
        if op == "d":
            self.records.append((partition, raw_key, None, ts))  # the tombstone

    def put(self, row: dict, ts: int) -> None:
        pk = row[self.key]
        before = self.rows.get(pk)
        self.rows[pk] = row
        self._emit(pk, "u" if before else "c", before, row, ts)

    def delete(self, pk: int, ts: int) -> None:
        self._emit(pk, "d", self.rows.pop(pk), None, ts)

    def take(self) -> list[tuple[int, bytes, bytes | None, int]]:
        records, self.records = self.records, []
        return records


def produce_interleaved(bootstrap: str, sources: list[Source], rng: random.Random) -> None:
    """Produce every source's pending records, each partition in order, the partitions interleaved at random."""
    queues = [(s.topic, p, [r for r in records if r[0] == p])
              for s in sources for records in [s.take()] for p in range(s.partitions)]
    queues = [q for q in queues if q[2]]
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    while queues:
        topic, partition, records = rng.choice(queues)
        _, key, value, ts = records.pop(0)
        producer.produce(topic, key=key, value=value, partition=partition, timestamp=ts)
        queues = [q for q in queues if q[2]]
    assert producer.flush(60) == 0


def join_config(name: str, kind: str, orders: Source, customers: Source, **extra) -> dict:
    return {"name": name, "table": name, "type": kind, "primary_key": ["order_id"], "max_offsets_per_trigger": 50,
            "left": {"topics": [orders.topic], "format": "json", "primary_key": ["order_id"],
                     "join_key": ["customer_id"]},
            "right": {"topics": [customers.topic], "format": "json", "primary_key": ["customer_id"],
                      "join_key": ["customer_id"]},
            **extra}


def run_until_idle(bootstrap: str, workdir: Path, joins: list[dict], plan: Path | None = None,
                   engine: str = "delta-rs") -> Runner:
    settings = settings_from_mapping({
        "kafka": {"bootstrap_servers": bootstrap}, "lakehouse": {"root": str(workdir / "tables"), "engine": engine},
        "checkpoint_root": str(workdir / "checkpoints"), "joins": joins,
        "recovery": {"initial_backoff_seconds": 0.2},
    })
    if plan is not None:  # as `cdc-lakehouse run CONFIG --plan PLAN` does
        settings = apply_plan(settings, read_plan(plan), source=str(plan))
    runner = Runner(settings)
    runner.start(until_idle=True)
    runner.wait()
    return runner


def output(workdir: Path, name: str) -> list[tuple]:
    return normalized(DeltaTable(str(workdir / "tables" / name)).to_pyarrow_table().to_pylist(), COLUMNS)


def expected(orders: Source, customers: Source, outer: bool) -> list[tuple]:
    rows = reference_join(orders.rows, customers.rows, "customer_id", "customer_id", outer, ("customer_id", "name"))
    return normalized(rows, COLUMNS)


def change_sources(orders: Source, customers: Source, rng: random.Random, steps: int, ts: int) -> int:
    """Random changes of both tables; returns the next timestamp."""
    next_order = max(orders.rows, default=0) + 1
    for _ in range(steps):
        ts += 1_000
        roll = rng.random()
        if roll < 0.25:
            pk = rng.randrange(1, 16)
            if pk in customers.rows and rng.random() < 0.3:
                customers.delete(pk, ts)
            else:
                customers.put({"customer_id": pk, "name": f"c{pk}-{rng.randrange(100)}"}, ts)
        elif roll < 0.4 and orders.rows:  # a primary-key change: delete the old key, create the new one
            old = rng.choice(sorted(orders.rows))
            row = orders.rows[old]
            orders.delete(old, ts)
            orders.put({**row, "order_id": next_order}, ts)
            next_order += 1
        elif roll < 0.5 and orders.rows:
            orders.delete(rng.choice(sorted(orders.rows)), ts)
        else:
            pk = rng.randrange(1, next_order + 1) if rng.random() < 0.6 else next_order
            next_order = max(next_order, pk + 1)
            orders.put({"order_id": pk, "customer_id": rng.randrange(1, 16), "amount": rng.randrange(1000)}, ts)
    return ts


def fail_first_state_commit(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The next state commit fails after the output MERGE went in (a crash between the two commits);
    returns the ids of the batches that failed so."""
    failed: list[int] = []
    commit = JoinStateStore.commit

    def once(self: JoinStateStore, step, app_id: str, batch_id: int) -> None:
        if not failed:
            failed.append(batch_id)
            raise DeltaWriteError("injected: the process died between the output and the state commit")
        commit(self, step, app_id, batch_id)

    monkeypatch.setattr(JoinStateStore, "commit", once)
    return failed


@pytest.mark.timeout(1200)  # delta-spark: a few seconds a MERGE on a loaded machine
@pytest.mark.parametrize("engine", ["delta-rs", "delta-spark"])
def test_inner_and_left_join_equal_the_join_of_the_final_tables(spark, kafka_bootstrap, unique, workdir, monkeypatch,
                                                                 engine):
    rng = random.Random(11)
    orders, customers = Source(f"orders.{unique}", "order_id", 3), Source(f"customers.{unique}", "customer_id", 2)
    create_topics(kafka_bootstrap, [orders.topic], 3)
    create_topics(kafka_bootstrap, [customers.topic], 2)
    joins = [join_config("orders_inner", "inner", orders, customers),
             join_config("orders_left", "left", orders, customers)]
    ts = change_sources(orders, customers, rng, 110, T0)
    produce_interleaved(kafka_bootstrap, [orders, customers], rng)
    first = run_until_idle(kafka_bootstrap, workdir, joins, engine=engine)
    assert all(p.committed_batches >= 2 for p in first.pipelines)  # several micro-batches
    assert output(workdir, "orders_inner") == expected(orders, customers, outer=False)
    assert output(workdir, "orders_left") == expected(orders, customers, outer=True)

    change_sources(orders, customers, rng, 60, ts)
    produce_interleaved(kafka_bootstrap, [orders, customers], rng)
    failed = fail_first_state_commit(monkeypatch)  # the pipeline restarts from its checkpoint and replays
    run_until_idle(kafka_bootstrap, workdir, joins, engine=engine)
    assert failed
    inner, left = expected(orders, customers, outer=False), expected(orders, customers, outer=True)
    assert output(workdir, "orders_inner") == inner and len(inner) > 5
    assert output(workdir, "orders_left") == left and any(row[-1] is None for row in left)

    versions = {name: DeltaTable(str(workdir / "tables" / name)).version() for name in ("orders_inner", "orders_left")}
    run_until_idle(kafka_bootstrap, workdir, joins, engine=engine)  # a restart with nothing new changes nothing
    assert {name: DeltaTable(str(workdir / "tables" / name)).version() for name in versions} == versions


def test_each_side_expires_by_its_own_ttl_in_data_time(kafka_bootstrap, unique, workdir):
    orders, customers = Source(f"ttl.orders.{unique}", "order_id", 1), Source(f"ttl.customers.{unique}", "customer_id", 1)
    create_topics(kafka_bootstrap, [orders.topic, customers.topic], 1)
    ttls = {"left_state_ttl_seconds": 3600, "right_state_ttl_seconds": 600}  # orders 1 h, customers 10 min
    joins = [join_config("ttl_inner", "inner", orders, customers, **ttls),
             join_config("ttl_left", "left", orders, customers, **ttls)]

    def phase(*changes) -> None:
        for change in changes:
            change()
        produce_interleaved(kafka_bootstrap, [orders, customers], random.Random(0))
        run_until_idle(kafka_bootstrap, workdir, joins)

    phase(lambda: customers.put({"customer_id": 1, "name": "ann"}, T0),
          lambda: orders.put({"order_id": 1, "customer_id": 1, "amount": 5}, T0))
    assert output(workdir, "ttl_inner") == [(1, 1, 5, 1, "ann")]
    # 20 minutes later: customer 1 expired (10 min), never seen again; its expiry retracted nothing.
    phase(lambda: orders.put({"order_id": 2, "customer_id": 1, "amount": 7}, T0 + 20 * MINUTE))
    assert output(workdir, "ttl_inner") == [(1, 1, 5, 1, "ann")]
    assert output(workdir, "ttl_left") == [(1, 1, 5, 1, "ann"), (2, 1, 7, None, None)]
    # 30 minutes: customer 1 again. Orders 1 and 2 are still in state (1 h): both join the new row.
    phase(lambda: customers.put({"customer_id": 1, "name": "bo"}, T0 + 30 * MINUTE))
    assert output(workdir, "ttl_inner") == [(1, 1, 5, 1, "bo"), (2, 1, 7, 1, "bo")]
    assert output(workdir, "ttl_left") == [(1, 1, 5, 1, "bo"), (2, 1, 7, 1, "bo")]


def test_one_ttl_edited_in_the_plan_changes_that_operator_alone(kafka_bootstrap, unique, workdir):
    """The config keeps both sides of both joins for 1 h; the plan file shortens the right state of
    `plan_inner` alone to 10 min. A customer silent for 20 min has expired there and nowhere else."""
    orders, customers = Source(f"plan.orders.{unique}", "order_id", 1), Source(f"plan.customers.{unique}", "customer_id", 1)
    create_topics(kafka_bootstrap, [orders.topic, customers.topic], 1)
    ttls = {"left_state_ttl_seconds": 3600, "right_state_ttl_seconds": 3600}
    joins = [join_config("plan_inner", "inner", orders, customers, **ttls),
             join_config("plan_other", "inner", orders, customers, **ttls)]
    plan = compile_plan(settings_from_mapping({"joins": joins}))
    edited = [entry for node in plan["nodes"] if node["id"] == "plan_inner/join" for entry in node["state"]
              if entry["name"] == "right"]
    assert len(edited) == 1 and edited[0]["ttl"] == "3600000 ms"
    edited[0]["ttl"] = "600000 ms"
    path = workdir / "plan.json"
    path.write_text(json.dumps(plan))

    def phase(*changes) -> None:
        for change in changes:
            change()
        produce_interleaved(kafka_bootstrap, [orders, customers], random.Random(0))
        run_until_idle(kafka_bootstrap, workdir, joins, plan=path)

    phase(lambda: customers.put({"customer_id": 1, "name": "ann"}, T0),
          lambda: orders.put({"order_id": 1, "customer_id": 1, "amount": 5}, T0))
    phase(lambda: orders.put({"order_id": 2, "customer_id": 1, "amount": 7}, T0 + 20 * MINUTE))
    assert output(workdir, "plan_inner") == [(1, 1, 5, 1, "ann")]  # customer 1 expired after 10 min
    assert output(workdir, "plan_other") == [(1, 1, 5, 1, "ann"), (2, 1, 7, 1, "ann")]  # 1 h: still there
