"""One workload, two wire formats: Debezium JSON (with its Connect schema block) into one topic and
Confluent-framed Avro (schemas in a Schema Registry) into another; `cdc-lakehouse run --until-idle`
with a `format: json` and a `format: avro-confluent` pipeline gives two identical Delta tables,
both equal to the workload's replay; a third pipeline reads the Avro topic through the materializer
(`upsert_materialize: force`, whose decode stage decodes Avro in bulk) into a third identical table.

Registry: Apicurio Registry's ccompat API (`apicurio_registry_url`), a real Confluent-compatible
server: the producer side registers, the service's executors fetch the schemas by id."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from deltalake import DeltaTable

from connectors.schema_registry.client import SchemaRegistryClient
from service.operations.workload import DebeziumWorkload, create_topics, produce
from testbed.avro_workload import to_avro
from tests.support.pipeline_harness import run_cli, write_config

pytestmark = pytest.mark.slow
EVENTS, KEYS, PARTITIONS = 4_000, 600, 2


def _table(workdir, name: str):
    data = DeltaTable(str(workdir / "tables" / name)).to_pyarrow_table()
    return data.schema, sorted(data.to_pylist(), key=lambda row: row["id"])


def test_json_and_avro_of_one_workload_give_identical_tables(kafka_bootstrap, apicurio_registry_url, unique, workdir):
    workload = DebeziumWorkload(f"json.{unique}", PARTITIONS, "always", seed=5, with_timestamp=True)
    events = workload.generate(EVENTS, KEYS)
    avro_topic = f"avro.{unique}"
    avro_events = to_avro([replace(event, topic=avro_topic) for event in events],
                          SchemaRegistryClient(apicurio_registry_url), with_timestamp=True)
    assert [(e.partition, e.key) for e in avro_events] == [(e.partition, e.key) for e in events]
    assert all(value[0] == 0 for value in (e.value for e in avro_events) if value is not None)  # Confluent framing
    create_topics(kafka_bootstrap, [workload.topic, avro_topic], PARTITIONS)
    assert produce(kafka_bootstrap, events) == produce(kafka_bootstrap, avro_events) >= EVENTS

    pipelines = [
        {"name": "p_json", "topics": [workload.topic], "format": "json", "table": "t_json", "primary_key": ["id"]},
        {"name": "p_avro", "topics": [avro_topic], "format": "avro-confluent",
         "schema_registry": {"url": apicurio_registry_url}, "table": "t_avro", "primary_key": ["id"]},
        {"name": "p_avro_materialized", "topics": [avro_topic], "format": "avro-confluent",
         "schema_registry": {"url": apicurio_registry_url}, "table": "t_avro_materialized", "primary_key": ["id"],
         "upsert_materialize": "force"},
    ]
    result = run_cli(write_config(workdir / "config.yaml", kafka_bootstrap, workdir, pipelines), "--until-idle")
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr  # the bucket stage's decode took its Avro ranges in bulk
    assert re.search(r"pipeline p_avro_materialized: batch 0 -> .* from \d+ Kafka range", output), output[-3000:]
    assert "decoded record by record" not in output, output[-3000:]

    json_schema, json_rows = _table(workdir, "t_json")
    avro_schema, avro_rows = _table(workdir, "t_avro")
    assert avro_schema == json_schema, f"{avro_schema} != {json_schema}"
    assert json_schema.names == ["id", "name", "email", "balance", "active", "updated_at"]
    materialized_schema, materialized_rows = _table(workdir, "t_avro_materialized")
    assert materialized_schema == json_schema, f"{materialized_schema} != {json_schema}"
    assert avro_rows == json_rows == materialized_rows == workload.expected_rows()
