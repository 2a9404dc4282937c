"""A value schema that evolves mid-stream, through a real registry: one topic carries Debezium
envelopes written with version 1 of `<topic>-value` and then with version 2, which adds a
nullable `tier` column with a default (a BACKWARD compatible change). `cdc-lakehouse run
--until-idle` decodes both versions into one Delta table, and a second pipeline through the materializer
(`upsert_materialize: force`: Avro decoded in bulk, typed images carried to the driver) into another: the
first run reads a batch holding both, the second run only version 2; rows last written with version 1
have `tier` null.

Registry: Apicurio Registry's ccompat API (`apicurio_registry_url`), reached through
`confluent_kafka.schema_registry`: it assigns the ids, keeps the two versions of the subject and
applies its BACKWARD rule (a version 3 whose new column has no default is refused with 409).
"""

from __future__ import annotations

import json

import pytest

from connectors.schema_registry.avro_codec import ConfluentAvroEncoder
from connectors.schema_registry.avro_types import debezium_envelope_schema
from connectors.schema_registry.client import SchemaRegistryClient
from connectors.schema_registry.errors import IncompatibleSchemaError
from service.operations.workload import Event, create_topics, produce
from tests.support.pipeline_harness import run_cli, table_rows, write_config
from vocabulary.changes import Envelope

pytestmark = pytest.mark.slow
V1 = {"id": "int64", "name": "string"}
V2 = {**V1, "tier": "string"}


class _Writer:
    """Debezium envelopes of one topic, framed with the encoder (schema version) of the call."""

    def __init__(self, topic: str) -> None:
        self.topic, self.ts_ms = topic, 1_790_000_000_000

    def change(self, encoder: ConfluentAvroEncoder, op: str, before: dict | None, after: dict | None) -> Event:
        self.ts_ms += 1
        row_id = (after or before)["id"]
        value = encoder.encode({Envelope.BEFORE: before, Envelope.AFTER: after, Envelope.OP: op,
                                Envelope.TS_MS: self.ts_ms})
        return Event(self.topic, 0, json.dumps({"id": row_id}).encode(), value)

    def delete(self, encoder: ConfluentAvroEncoder, before: dict) -> list[Event]:
        deleted = self.change(encoder, "d", before, None)
        return [deleted, Event(self.topic, 0, deleted.key, None)]


def _run(config, expected: list[dict], tables) -> None:
    result = run_cli(config, "--until-idle", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    for table in tables:
        assert table_rows(table) == expected, table


def test_two_versions_of_the_value_schema_decode_into_one_table(kafka_bootstrap, apicurio_registry_url, unique,
                                                                 workdir):
    topic, subject = f"evolve.{unique}", f"evolve.{unique}-value"
    namespace = f"evolve_{unique}"
    client = SchemaRegistryClient(apicurio_registry_url)
    v1 = ConfluentAvroEncoder(client, subject, debezium_envelope_schema(namespace, V1, required=("id",)))
    v2 = ConfluentAvroEncoder(client, subject, debezium_envelope_schema(namespace, V2, required=("id",)))
    writer = _Writer(topic)
    create_topics(kafka_bootstrap, [topic], 1)

    # Version 1 writes six rows and deletes one; version 2 updates three and creates one.
    rows = {i: {"id": i, "name": f"n{i}"} for i in range(1, 7)}
    first = [writer.change(v1, "c", None, row) for row in rows.values()] + writer.delete(v1, rows[6])
    for i in (1, 2, 3):
        first.append(writer.change(v2, "u", {**rows[i], "tier": None}, {**rows[i], "tier": "gold"}))
    first.append(writer.change(v2, "c", None, {"id": 7, "name": "n7", "tier": "silver"}))
    assert v1.schema_id != v2.schema_id
    latest = client.latest(subject)
    assert (latest.version, latest.schema_id) == (2, v2.schema_id)
    assert produce(kafka_bootstrap, first) == len(first)

    pipeline = {"name": f"p-{unique}", "topics": [topic], "format": "avro-confluent", "table": "evolving",
                "schema_registry": {"url": apicurio_registry_url}, "primary_key": ["id"]}
    materialized = {**pipeline, "name": f"m-{unique}", "table": "evolving_materialized", "upsert_materialize": "force"}
    config = write_config(workdir / "config.yaml", kafka_bootstrap, workdir, [pipeline, materialized])
    table = (workdir / "tables" / "evolving", workdir / "tables" / "evolving_materialized")
    tiers = {1: "gold", 2: "gold", 3: "gold", 4: None, 5: None, 7: "silver"}
    _run(config, [{"id": i, "name": f"n{i}", "tier": tier} for i, tier in tiers.items()], table)

    # Only version 2 from here on: an update of a row version 1 wrote, and a delete.
    second = [writer.change(v2, "u", {**rows[5], "tier": None}, {**rows[5], "tier": "bronze"}),
              *writer.delete(v2, {**rows[2], "tier": "gold"})]
    assert produce(kafka_bootstrap, second) == len(second)
    tiers = {1: "gold", 3: "gold", 4: None, 5: "bronze", 7: "silver"}
    _run(config, [{"id": i, "name": f"n{i}", "tier": tier} for i, tier in tiers.items()], table)

    required = debezium_envelope_schema(namespace, {**V2, "rank": "int64"}, required=("id", "rank"))
    with pytest.raises(IncompatibleSchemaError):
        client.register(subject, required)  # old data has no rank and the new column no default
    assert client.latest(subject).version == 2
