"""A database source through Apache Kafka with two tables: `customers` with `history: scd2`, a masked
column and `deletes: soft` (its own query, the pipeline `<database>.customers`), `orders` in the default
shape (the database's shared query). Two rounds of Debezium changes, three records per micro-batch (so
a round per batch) in one service run; the tables end as a model of the rules says, read with delta-rs and with Spark, and no raw masked value is in any
file of the current-row or the history table."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from confluent_kafka import Producer
from deltalake import DeltaTable

from service.config.settings import settings_from_mapping
from service.operations.workload import create_topics
from service.supervisor.runner import Runner

SALT_ENV = "CDC_TEST_TABLE_SHAPE_SALT"
SALT = "pepper-db"
HISTORY = ["__START_AT", "__END_AT", "__UPDATED_AT", "__DELETED"]


def _hashed(value: str) -> str:
    return hashlib.sha256((SALT + value).encode()).hexdigest()


def _produce(bootstrap: str, topic: str, changes: list[tuple[str, int, dict]]) -> list[int]:
    """Debezium envelopes of `(op, lsn, row)` into partition 0; the Kafka timestamps of the records."""
    producer = Producer({"bootstrap.servers": bootstrap})
    stamps: list[int] = []
    for op, lsn, row in changes:
        value = {"before": row if op == "d" else None, "after": None if op == "d" else row, "op": op,
                 "source": {"lsn": lsn, "ts_ms": 1_700_000_000_000 + lsn}, "ts_ms": 1_700_000_000_000 + lsn}
        producer.produce(topic, key=json.dumps({"id": row["id"]}).encode(), value=json.dumps(value).encode(),
                         partition=0, on_delivery=lambda err, msg: stamps.append(msg.timestamp()[1]))
    assert producer.flush(30) == 0
    return stamps


def _run(settings) -> None:
    runner = Runner(settings)
    runner.start(until_idle=True)
    runner.wait()


def _rows(uri: str, spark, order: tuple[str, ...]) -> list[dict]:
    """The table's rows as delta-rs reads them, checked equal to Spark's reading."""
    def key(row: dict) -> tuple:
        return tuple((row[c] is None, row[c]) for c in order)

    by_rs = sorted(DeltaTable(uri).to_pyarrow_table().to_pylist(), key=key)
    by_spark = sorted(spark.read.format("delta").load(uri).toArrow().to_pylist(), key=key)
    assert by_rs == by_spark
    return by_rs


def test_a_table_with_history_masking_and_soft_deletes_beside_a_default_table(
        spark, kafka_bootstrap, unique, workdir, monkeypatch):
    monkeypatch.setenv(SALT_ENV, SALT)
    customers, orders = f"shape-{unique}.customers", f"shape-{unique}.orders"
    create_topics(kafka_bootstrap, [customers, orders], 1)
    settings = settings_from_mapping({
        "kafka": {"bootstrap_servers": kafka_bootstrap}, "lakehouse": {"root": str(workdir / "tables")},
        "checkpoint_root": str(workdir / "checkpoints"),
        "databases": [{"name": "shop", "max_offsets_per_trigger": 3, "topic_pattern": rf"shape-{unique}\.(?P<table>[^.]+)", "tables": {
            "customers": {"primary_key": ["id"], "history": "scd2", "table_shape": {"deletes": "soft"},
                          "columns": {"mask": {"email": "sha256"}, "salt_env": SALT_ENV}}}}],
    })

    def customer(pid: int, name: str, email: str) -> dict:
        return {"id": pid, "name": name, "email": email}

    _produce(kafka_bootstrap, customers, [("c", 1, customer(1, "ann", "ann@a.org")),
                                          ("c", 2, customer(2, "bo", "bo@b.org")),
                                          ("c", 3, customer(3, "cy", "cy@c.org"))])
    _produce(kafka_bootstrap, orders, [("c", 1, {"id": 10, "total": 5}), ("c", 2, {"id": 11, "total": 7})])
    stamps = _produce(kafka_bootstrap, customers, [("u", 4, customer(1, "ann", "ann@new.org")),
                                                   ("d", 5, customer(2, "bo", "bo@b.org")),
                                                   ("u", 6, customer(3, "cyra", "cy@c.org"))])
    _produce(kafka_bootstrap, orders, [("u", 3, {"id": 10, "total": 6}), ("d", 4, {"id": 11, "total": 7})])
    _run(settings)

    tables = workdir / "tables"
    assert sorted(p.name for p in tables.iterdir()) == ["customers", "customers_history", "orders"]
    assert _rows(str(tables / "orders"), spark, ("id",)) == [{"id": 10, "total": 6}]

    current = _rows(str(tables / "customers"), spark, ("id",))
    deleted_at = current[1].pop("__DELETED_AT")
    assert deleted_at is not None and int(deleted_at.timestamp() * 1000) == stamps[1]
    assert current == [
        {"id": 1, "name": "ann", "email": _hashed("ann@new.org"), "__DELETED": False, "__DELETED_AT": None},
        {"id": 2, "name": "bo", "email": _hashed("bo@b.org"), "__DELETED": True},
        {"id": 3, "name": "cyra", "email": _hashed("cy@c.org"), "__DELETED": False, "__DELETED_AT": None},
    ]

    history = _rows(str(tables / "customers_history"), spark, ("id", "__START_AT"))
    assert [{k: row[k] for k in ("id", "name", "email", *HISTORY)} for row in history] == [
        {"id": 1, "name": "ann", "email": _hashed("ann@a.org"), "__START_AT": 1, "__END_AT": 4, "__UPDATED_AT": 1,
         "__DELETED": False},
        {"id": 1, "name": "ann", "email": _hashed("ann@new.org"), "__START_AT": 4, "__END_AT": None,
         "__UPDATED_AT": 4, "__DELETED": False},
        {"id": 2, "name": "bo", "email": _hashed("bo@b.org"), "__START_AT": 2, "__END_AT": 5, "__UPDATED_AT": 2,
         "__DELETED": False},
        {"id": 3, "name": "cy", "email": _hashed("cy@c.org"), "__START_AT": 3, "__END_AT": 6, "__UPDATED_AT": 3,
         "__DELETED": False},
        {"id": 3, "name": "cyra", "email": _hashed("cy@c.org"), "__START_AT": 6, "__END_AT": None,
         "__UPDATED_AT": 6, "__DELETED": False},
    ]
    stored = b"".join(path.read_bytes() for name in ("customers", "customers_history")
                      for path in Path(tables / name).rglob("*") if path.is_file())
    assert b"@a.org" not in stored and b"@new.org" not in stored and b"@b.org" not in stored
    assert not (workdir / "checkpoints" / "shop.orders").exists()  # the default table stays in the shared query
    assert (workdir / "checkpoints" / "shop.customers").is_dir()
