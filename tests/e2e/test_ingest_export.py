"""Ingest and export in one `cdc-lakehouse run --until-idle` process.

Debezium envelopes (a synthetic workload of inserts, updates, deletes and tombstones) are
ingested into a Delta table; two exports publish that table's change feed in the same run,
as Debezium envelopes (no tombstones) and as flat records. An independent read_committed
consumer replays each output topic (upsert by key, delete on the delete code), checking
every record against the replayed state: a create or insert only for an absent key, an
update's and a delete's before image equal to the key's current row. The replay ends
exactly equal to the Delta table read back with deltalake. A second run publishes nothing. The ingested
table is created with deletion vectors (`table_shape: {deletion_vectors: true}`): its MERGEs mark changed
rows deleted, and the exports read its change feed all the same.

In until-idle mode the runner starts the exports after the ingests finished, so one run
publishes everything it ingested: the first run alone must reproduce the table.

The same run carries a second pipeline with `table_shape: {deletes: soft, ignore_null_updates: true}`
(issue 26) over a small topic of rounds (one round per micro-batch, a key at most once per round): its
table keeps deleted keys with `__DELETED` and `__DELETED_AT` (the delete's Kafka timestamp), updates
carrying nulls keep the stored values, and it equals a model applying those rules in the source's order.
Its Debezium export publishes a soft delete as an update setting the flag (never a delete) and a
re-insert as an update clearing it; replayed, the export ends equal to that table, deleted rows included.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from deltalake import DeltaTable

from service.config.table_shape import DELETED, DELETED_AT
from service.operations.workload import DebeziumWorkload, create_topics, produce
from tests.support.pipeline_harness import run_cli, table_rows, table_version, write_config
from vocabulary.changes import DebeziumOp, Envelope

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EVENTS, KEYS = 4_000, 700
OUTPUT_PARTITIONS = 3
TABLE = "customers"
CREATE_CODES = {DebeziumOp.CREATE.value, DebeziumOp.READ.value}
FLAT_UPSERT_CODES = {"INSERT", "UPDATE_AFTER"}
SHAPED = "shaped"
SHAPE = {"deletes": "soft", "ignore_null_updates": True}
# (op, key, row) per round; a round is one micro-batch. None in an update: the source sent no value.
ROUNDS = [
    [("c", 1, {"name": "ann", "email": "a@x", "score": 1}), ("c", 2, {"name": "bo", "email": "b@x", "score": 2}),
     ("c", 3, {"name": "cy", "email": "c@x", "score": 3}), ("d", 9, {"name": "zed", "email": "z@x", "score": 9})],
    [("u", 1, {"name": None, "email": "a2@x", "score": None}), ("d", 2, None),
     ("u", 3, {"name": "cy2", "email": None, "score": 33}), ("c", 4, {"name": "di", "email": None, "score": 4})],
    [("c", 2, {"name": "bo2", "email": "b2@x", "score": 22}), ("u", 4, {"name": None, "email": "d@x", "score": None}),
     ("d", 3, None), ("u", 1, {"name": "ann2", "email": None, "score": None})],
    [("c", 9, {"name": "zed2", "email": None, "score": 90}), ("d", 4, None)],  # a re-insert stores its null
]
ROUND = max(map(len, ROUNDS))


def consume_committed(bootstrap: str, topic: str, partitions: int) -> dict[int, list[tuple]]:
    """Every record of `topic` a read_committed consumer sees: partition -> [(key, value, headers)]."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"replay-{topic}", "isolation.level": "read_committed",
        "enable.partition.eof": True, "enable.auto.commit": False, "session.timeout.ms": 6000,
    })
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records: dict[int, list[tuple]] = {p: [] for p in range(partitions)}
    at_end: set[int] = set()
    try:
        while len(at_end) < partitions:
            message = consumer.poll(30)
            assert message is not None, f"no end of {topic} within 30s"
            if message.error() is not None:
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                at_end.add(message.partition())
                continue
            records[message.partition()].append((message.key(), message.value(), message.headers()))
    finally:
        consumer.close()
    return records


def json_form(row: dict) -> dict:
    """A Delta row as the exports write it (timestamps as ISO-8601 text; the rest is JSON already)."""
    shown = {}
    for column, value in row.items():
        if isinstance(value, datetime) and value.tzinfo is None:
            value = value.strftime("%Y-%m-%dT%H:%M:%S.%f")
        elif isinstance(value, datetime):
            value = value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        shown[column] = value
    return shown


def replay_debezium(records: dict[int, list[tuple]]) -> dict[int, dict]:
    """Apply Debezium envelopes partition by partition (a key lives in one partition)."""
    state: dict[int, dict] = {}
    for partition, in_order in records.items():
        for raw_key, raw_value, _ in in_order:
            key = json.loads(raw_key)["id"]
            assert raw_value is not None, f"partition {partition}: a tombstone although tombstones are off"
            envelope = json.loads(raw_value)
            op = envelope[Envelope.OP]
            if op in CREATE_CODES:
                assert key not in state and envelope[Envelope.BEFORE] is None, f"create of live key {key}"
            else:
                assert envelope[Envelope.BEFORE] == state.get(key), f"{op} of key {key}: before image != replay"
            if op == DebeziumOp.DELETE.value:
                assert envelope[Envelope.AFTER] is None
                del state[key]
            else:
                assert envelope[Envelope.AFTER]["id"] == key
                state[key] = envelope[Envelope.AFTER]
    return state


def replay_flat(records: dict[int, list[tuple]]) -> dict[int, dict]:
    """Apply flat records: INSERT / UPDATE_AFTER upsert, DELETE (key columns only) deletes."""
    state: dict[int, dict] = {}
    for in_order in records.values():
        for raw_key, raw_value, _ in in_order:
            key = json.loads(raw_key)["id"]
            value = json.loads(raw_value)
            op = value.pop("op")
            if op == "DELETE":
                assert value == {"id": key}, "a partial delete carries the key columns only"
                assert key in state, f"delete of absent key {key}"
                del state[key]
                continue
            assert op in FLAT_UPSERT_CODES, op
            assert (key in state) == (op == "UPDATE_AFTER"), f"{op} of key {key}"
            state[key] = value
    return state


def _shaped_model(start: datetime) -> tuple[list[tuple[bytes, bytes, int]], dict[int, dict]]:
    """The shaped pipeline's records (key, value, Kafka timestamp ms from `start` on; recent, as the
    topic's time retention would delete older ones) and the table its rules make of them:
    an update writes its non-null values over the stored ones (all of them for an absent key), an insert
    (also a re-insert of a deleted key) all of its values, and both clear the flags; a delete keeps the stored row (the key alone for an absent key), flagged, at its record's time."""
    records, table = [], {}
    for number, changes in enumerate(ROUNDS):
        for index, (op, key, values) in enumerate(changes):
            at = start + timedelta(minutes=number, seconds=index)
            stored = table.get(key)
            shown = {k: v for k, v in (stored or {}).items() if k not in (DELETED, DELETED_AT)}
            if op == "d":
                before = {"id": key, **values} if stored is None else shown
                document = {"before": before, "after": None, "op": op}
                table[key] = {**dict.fromkeys(("name", "email", "score")), **shown, "id": key,
                              DELETED: True, DELETED_AT: at}
            else:
                document = {"before": shown or None if op == "u" else None, "after": {"id": key, **values}, "op": op}
                kept = {k: v if v is not None or stored is None or op == "c" else stored[k] for k, v in values.items()}
                table[key] = {"id": key, **kept, DELETED: False, DELETED_AT: None}
            records.append((json.dumps({"id": key}).encode(), json.dumps(document).encode(),
                            int(at.timestamp() * 1000)))
    return records, table


def _produce_shaped(bootstrap: str, topic: str) -> dict[int, dict]:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    records, table = _shaped_model(datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=1))
    for key, value, timestamp in records:
        producer.produce(topic, key=key, value=value, timestamp=timestamp, partition=0)
    assert producer.flush(30) == 0
    return table


def _config(workdir, bootstrap: str, source: str, unique: str, engine: str):
    pipeline = {"name": f"ingest-{unique}", "topics": [source], "table": TABLE, "primary_key": ["id"],
                "max_offsets_per_trigger": 1_500, "table_shape": {"deletion_vectors": True}}
    shaped = {"name": f"shaped-{unique}", "topics": [f"db.shaped.{unique}"], "table": SHAPED, "primary_key": ["id"],
              "max_offsets_per_trigger": ROUND, "table_shape": SHAPE}
    exports = [
        {"name": f"dbz-{unique}", "table": TABLE, "topic": f"out.dbz.{unique}", "primary_key": ["id"],
         "preset": "debezium", "tombstones": False, "max_versions_per_trigger": 2},
        {"name": f"flat-{unique}", "table": TABLE, "topic": f"out.flat.{unique}", "primary_key": ["id"],
         "preset": "flat", "max_versions_per_trigger": 1},
        {"name": f"shaped-dbz-{unique}", "table": SHAPED, "topic": f"out.shaped.{unique}", "primary_key": ["id"],
         "preset": "debezium", "tombstones": False, "compaction": "none"},  # every version's changes, one flush
    ]
    config = write_config(workdir / "config.yaml", bootstrap, workdir, [pipeline, shaped], engine, exports=exports)
    return config, exports


@pytest.mark.parametrize("engine", ["delta-rs", "delta-spark"])
def test_one_process_ingests_and_exports_exactly_once(kafka_bootstrap, unique, workdir, engine):
    workload = DebeziumWorkload(f"db.customers.{unique}", 4, "always", seed=21, with_timestamp=True)
    create_topics(kafka_bootstrap, [workload.topic], 4)
    produced = produce(kafka_bootstrap, workload.generate(EVENTS, KEYS))
    assert produced >= EVENTS
    config, exports = _config(workdir, kafka_bootstrap, workload.topic, unique, engine)
    dbz_topic, flat_topic, shaped_topic = (e["topic"] for e in exports)
    create_topics(kafka_bootstrap, [dbz_topic, flat_topic, shaped_topic], OUTPUT_PARTITIONS)
    create_topics(kafka_bootstrap, [f"db.shaped.{unique}"], 1)
    shaped_model = _produce_shaped(kafka_bootstrap, f"db.shaped.{unique}")

    first = run_cli(config, "--until-idle")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "starting the exports" in first.stderr
    uri = workdir / "tables" / TABLE
    table = table_rows(uri)
    assert table == workload.expected_rows()
    assert DeltaTable(str(uri)).version() >= 2, "several ingest batches, so the exports span several versions"
    assert any("deletionVector" in entry.read_text() for entry in (uri / "_delta_log").glob("*.json")), \
        "no MERGE marked rows deleted"
    expected = {row["id"]: json_form(row) for row in table}

    dbz = consume_committed(kafka_bootstrap, dbz_topic, OUTPUT_PARTITIONS)
    flat = consume_committed(kafka_bootstrap, flat_topic, OUTPUT_PARTITIONS)
    assert replay_debezium(dbz) == expected
    assert replay_flat(flat) == expected
    assert sum(map(len, dbz.values())) >= len(expected)
    shaped = _assert_shaped(kafka_bootstrap, workdir / "tables" / SHAPED, shaped_topic, shaped_model)

    version = table_version(uri)
    second = run_cli(config, "--until-idle")
    assert second.returncode == 0, second.stderr[-3000:]
    assert table_version(uri) == version
    assert consume_committed(kafka_bootstrap, dbz_topic, OUTPUT_PARTITIONS) == dbz
    assert consume_committed(kafka_bootstrap, flat_topic, OUTPUT_PARTITIONS) == flat
    assert consume_committed(kafka_bootstrap, shaped_topic, OUTPUT_PARTITIONS) == shaped


def _assert_shaped(bootstrap: str, uri, topic: str, model: dict[int, dict]) -> dict[int, list[tuple]]:
    """The soft-delete, ignore-null-updates table equals the model; its export replays to it, soft deletes
    published as updates setting the flag."""
    rows = table_rows(uri)
    assert rows == [model[key] for key in sorted(model)]
    assert [(row["id"], row[DELETED]) for row in rows] == [(1, False), (2, False), (3, True), (4, True), (9, False)]
    merges = [entry for entry in DeltaTable(str(uri)).history() if entry["operation"] == "MERGE"]
    assert len(merges) == len(ROUNDS), "one MERGE per round"
    published = consume_committed(bootstrap, topic, OUTPUT_PARTITIONS)
    assert replay_debezium(published) == {row["id"]: json_form(row) for row in rows}
    history: dict[int, list[tuple]] = {}
    for in_order in published.values():
        for raw_key, raw_value, _ in in_order:
            envelope = json.loads(raw_value)
            after = envelope[Envelope.AFTER]
            history.setdefault(json.loads(raw_key)["id"], []).append((envelope[Envelope.OP], after[DELETED]))
    assert history[2] == [("c", False), ("u", True), ("u", False)], history  # deleted, then re-inserted
    assert history[9] == [("c", True), ("u", False)], history  # a delete of an absent key, then an insert
    assert history[3] == [("c", False), ("u", False), ("u", True)], history
    return published
