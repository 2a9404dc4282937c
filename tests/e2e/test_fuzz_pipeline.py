"""Fuzz through the real pipeline: mutated records -> Kafka -> `cdc-lakehouse run --until-idle` -> Delta.

2,000 records of `testbed.fuzz_records` (Debezium JSON with and without the schema block, flat
op-coded JSON, Confluent Avro through Apicurio Registry's ccompat API (`apicurio_registry_url`,
the real server the service's executors fetch schemas from); `EXCLUDED` says which mutations are
left out and why) go to one topic per format (3 partitions each, offsets as generated), and one
CLI run ingests every topic twice: under DEAD_LETTER (a dead-letter topic per pipeline) and under
SKIP. The service exits 0; each table
equals the replay of the records the decoder accepts (`testbed.fuzz_accounting.decode`, the same
settings, all in one micro-batch: the last change per key in (partition, offset) order wins);
every record it rejects is in the DEAD_LETTER pipeline's dead-letter topic, read read_committed,
with its key, value and headers byte for byte and its coordinates in the metadata headers; the
SKIP pipelines read every offset (no lag) and applied none of them.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable

from connectors.schema_registry.client import SchemaRegistryClient
from service.config.settings import load_settings
from service.kafka_to_delta.sink.dead_letters import DlqHeader
from service.operations.status import status
from service.operations.workload import create_topics
from testbed.fuzz_accounting import decode
from testbed.fuzz_records import FORMATS, PARTITIONS, FuzzFormat, FuzzInput, generate
from tests.support.pipeline_harness import read_committed, run_cli, write_config

pytestmark = pytest.mark.slow
RECORDS = 2_000
SEED = int(os.environ.get("FUZZ_SEED", 7))
POLICIES = ("DEAD_LETTER", "SKIP")
ONE_BATCH = 100 * RECORDS
# Records without declared column types (bare JSON, flat) give the decoder nothing to check a
# row against: one whose value contradicts the table's column type (text in an int64 column, an
# integer beyond 64 bits), or whose flipped bit renames a column to a case twin of another
# ('aCtive'), fails the sink's conversion or the table's schema for the whole batch. Those
# mutations run on the typed formats only (the decoder rejects such records there).
UNTYPED_UNSAFE = frozenset({"wrong-type", "huge-number", "non-finite", "deep-nesting", "keyless-delete",
                            "event-time", "bit-flip"})
SLOW = frozenset({"many-columns"})  # thousands of new columns: the MERGE takes minutes
EXCLUDED = {name: SLOW | (frozenset() if fmt.typed else UNTYPED_UNSAFE) for name, fmt in FORMATS.items()}


def _produce(bootstrap: str, fuzz: FuzzInput, topic_of: dict[str, str]) -> None:
    """Every record to its topic and partition, checking the broker gives it its generated offset."""
    landed: set[tuple[str, int, int]] = set()

    def delivered(error, message) -> None:
        assert error is None, error
        landed.add((message.topic(), message.partition(), message.offset()))

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20,
                         "message.max.bytes": 2_000_000})
    for record in fuzz.records:
        producer.produce(topic_of[record.topic], key=record.key, value=record.value, partition=record.partition,
                         headers=record.headers, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert set(landed) == {(topic_of[r.topic], r.partition, r.offset) for r in fuzz.records}


def _pipeline(fmt: FuzzFormat, policy: str, topic: str, registry_url: str, unique: str) -> dict:
    name = f"fz_{fmt.name.replace('-', '_')}_{policy.lower()}"
    pipeline = {"name": name, "topics": [topic], "table": name, "primary_key": ["id"],
                "max_offsets_per_trigger": ONE_BATCH,  # the replay's order: one micro-batch
                "from_changelog": fmt.config(policy, pipeline=True)}  # type: ignore[arg-type]
    if fmt.avro:
        pipeline.update({"format": "avro-confluent", "schema_registry": {"url": registry_url}})
    if policy == "DEAD_LETTER":
        pipeline["dead_letters"] = {"topic": f"dlq-{fmt.name}-{unique}", "positions_topic": f"dlq-pos-{unique}"}
    return pipeline


def _replay(rows: list[dict], schema: pa.Schema) -> list[dict]:
    """The table the accepted change rows of one topic leave: the last change per key wins."""
    table: dict[str, dict | None] = {}
    for row in sorted(rows, key=lambda r: (r["partition"], r["offset"], r["change_index"])):
        table[row["key"]] = json.loads(row["row"]) if row["kind"] in ("+I", "+U") else None
    stored = [{column: _stored(value, schema.field(column).type) for column, value in row.items()}
              for row in table.values() if row is not None]
    return sorted(map(_present, stored), key=_order)


def _stored(value: object, column_type: pa.DataType) -> object:
    """A JSON value as a column of that type holds it: JSON text in a string column, floats in a double one."""
    if value is None:
        return None
    if pa.types.is_string(column_type) and not isinstance(value, str):
        return json.dumps(value, separators=(",", ":"))
    if pa.types.is_floating(column_type):
        return float(value)  # type: ignore[arg-type]
    return value


def _present(row: dict) -> dict:
    """A row without its null columns (a column added by schema evolution is null elsewhere)."""
    return {column: value for column, value in row.items() if value is not None}


def _table(uri: str) -> tuple[list[dict], pa.Schema]:
    """(rows without their null columns, schema) of a Delta table."""
    data = DeltaTable(uri).to_pyarrow_table()
    return sorted(map(_present, data.to_pylist()), key=_order), data.schema


def _order(row: dict) -> str:
    return json.dumps(row.get("id"), sort_keys=True, default=str)


def _assert_dead_letters(bootstrap: str, dlq_topic: str, topic: str, rejected: list[dict]) -> None:
    messages = {}
    for message in read_committed(bootstrap, dlq_topic):
        headers = message.headers() or []
        metadata = dict(h for h in headers if h[0].startswith(DlqHeader.PREFIX))
        where = (int(metadata[DlqHeader.PARTITION]), int(metadata[DlqHeader.OFFSET]))
        assert metadata[DlqHeader.TOPIC] == topic.encode() and where not in messages, where
        messages[where] = (message.key(), message.value(), [h for h in headers if not h[0].startswith(DlqHeader.PREFIX)],
                           metadata[DlqHeader.STAGE].decode(), metadata[DlqHeader.ERROR].decode())
    expected = {(row["partition"], row["offset"]): (row["raw_key"], row["raw_value"],
                                                     [(h["key"], h["value"]) for h in row["headers"] or []],
                                                     row["stage"], row["error"]) for row in rejected}
    assert sorted(messages) == sorted(expected), f"{dlq_topic}: dead letters differ from the rejected records"
    for where, letter in messages.items():
        assert letter == expected[where], f"{dlq_topic} {where}: not the record byte for byte"


def test_mutated_records_are_applied_dead_lettered_or_skipped(kafka_bootstrap, apicurio_registry_url, unique, workdir):
    fuzz = generate(SEED, RECORDS, SchemaRegistryClient(apicurio_registry_url), EXCLUDED)
    topic_of = {fmt.topic: f"{fmt.topic}-{unique}" for fmt in FORMATS.values()}
    create_topics(kafka_bootstrap, topic_of.values(), PARTITIONS)
    create_topics(kafka_bootstrap, [f"dlq-{name}-{unique}" for name in FORMATS], 1)
    _produce(kafka_bootstrap, fuzz, topic_of)
    pipelines = [_pipeline(fmt, policy, topic_of[fmt.topic], apicurio_registry_url, unique)
                 for fmt in FORMATS.values() for policy in POLICIES]
    config = write_config(workdir / "config.yaml", kafka_bootstrap, workdir, pipelines)
    result = run_cli(config, "--until-idle")
    assert result.returncode == 0, f"seed {SEED}: {result.stderr[-3000:]}"

    for status_ in status(load_settings(config)):
        assert status_.lag == 0, (status_.name, status_.committed, status_.end)
    for policy in POLICIES:
        decoded = decode(fuzz, policy, pipeline=True)
        assert not decoded.crashes, decoded.crashes
        by_topic: dict[str, dict[bool, list[dict]]] = defaultdict(lambda: {True: [], False: []})
        for row in decoded.table.to_pylist():
            by_topic[row["topic"]][row["error"] is None].append(row)
        for fmt in FORMATS.values():
            accepted, rejected = by_topic[fmt.topic][True], by_topic[fmt.topic][False]
            name = f"fz_{fmt.name.replace('-', '_')}_{policy.lower()}"
            got, schema = _table(str(workdir / "tables" / name))
            assert got == _replay(accepted, schema), f"seed {SEED}: table {name} is not the replay of the accepted " \
                                                     "records"
            assert rejected and all(row["handling"] == policy for row in rejected), name
            if policy == "DEAD_LETTER":
                _assert_dead_letters(kafka_bootstrap, f"dlq-{fmt.name}-{unique}", topic_of[fmt.topic], rejected)
