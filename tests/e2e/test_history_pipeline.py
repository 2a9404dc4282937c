"""A pipeline with `history:` end to end: Debezium envelopes in Kafka (two partitions; updates, deletes with
their tombstones, a re-insert, a primary-key change, a late older change, a duplicate) -> `cdc-lakehouse run
--until-idle` -> the current table and the history table, the latter equal to the history walked from the
produced changes. Replays are the sink's integration test's (tests/integration/.../test_history_sink.py)."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer

from service.operations.workload import create_topics
from tests.support.history_reference import reference
from tests.support.pipeline_harness import run_cli, table_rows, write_config

pytestmark = pytest.mark.slow
# (id, source.lsn, delete?, a, b) in production order; a key's changes share its partition (id % 2).
CHANGES = [
    (1, 10, False, "x", 0), (2, 11, False, "x", 1), (1, 30, False, "z", 0), (2, 12, False, "x", 2),
    (1, 20, False, "y", 0),  # late: older than 30, produced after it
    (2, 13, True, None, 0), (3, 13, False, "x", 2),  # primary-key change 2 -> 3: a delete and a create
    (2, 40, False, "w", 5),  # re-insert of 2
    (1, 35, False, "z", 0), (1, 35, False, "z", 0),  # a duplicate
]


def _produce(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, lsn, deleted, a, b in CHANGES:
        row = None if deleted else {"id": key, "a": a, "b": b}
        value = {"op": "d" if deleted else "c" if lsn < 12 else "u", "before": {"id": key} if deleted else None,
                 "after": row, "source": {"lsn": lsn}, "ts_ms": lsn}
        producer.produce(topic, key=json.dumps({"id": key}), value=json.dumps(value), partition=key % 2)
        if deleted:
            producer.produce(topic, key=json.dumps({"id": key}), value=None, partition=key % 2)
    producer.flush(30)


def test_history_table_equals_the_walked_history(kafka_bootstrap, unique, workdir):
    topic = f"history.{unique}"
    create_topics(kafka_bootstrap, [topic], 2)
    _produce(kafka_bootstrap, topic)
    pipeline = {"name": "customers", "topics": [topic], "table": "customers", "primary_key": ["id"],
                "history": {"track_history_column_list": ["a"]}}
    config = write_config(workdir / "config.yaml", kafka_bootstrap, workdir, [pipeline])
    first = run_cli(config, "--until-idle")
    assert first.returncode == 0, first.stderr[-3000:]
    history = workdir / "tables" / "customers_history"
    stored = sorted(table_rows(history), key=lambda r: (r["id"], r["__START_AT"]))
    assert stored == reference(CHANGES, ("a",), False)
    assert sorted(table_rows(workdir / "tables" / "customers"), key=lambda r: r["id"]) == [
        {"id": 1, "a": "z", "b": 0}, {"id": 2, "a": "w", "b": 5}, {"id": 3, "a": "x", "b": 2}]
