"""`cdc-lakehouse run` with Avro ingest and Avro export through `confluent_kafka.schema_registry`
against the registry double over HTTPS (its certificate signed by a CA made here) with basic
auth, both configured by one top-level `schema_registry:` block whose credentials come from the
environment. A second export whose subject holds a schema the new one is not BACKWARD
compatible with is refused by the registry; the run fails naming the subject and version.

Registry: the in-repo double, because this test is about HTTPS with basic auth and Apicurio
Registry authenticates only through an OpenID Connect server (none here). The plain-HTTP Avro
paths, the 409 of a real BACKWARD rule and schema evolution run against Apicurio Registry in
test_avro_ingest.py, test_avro_schema_evolution.py and tests/integration/."""

from __future__ import annotations

from typing import Iterator

import pytest

from connectors.schema_registry.avro_codec import ConfluentAvroDecoder
from connectors.schema_registry.client import SchemaRegistryClient
from connectors.schema_registry.connection import RegistryConnection
from service.operations.workload import DebeziumWorkload, create_topics, produce
from testbed.avro_workload import to_avro
from tests.e2e.test_ingest_export import consume_committed
from tests.support.pipeline_harness import run_cli, table_rows, write_config
from tests.support.registry_tls import CertificateFiles, make_certificates
from tests.support.schema_registry_double import SchemaRegistryDouble
from vocabulary.changes import DebeziumOp, Envelope

pytestmark = pytest.mark.slow
EVENTS, KEYS, PARTITIONS = 800, 120, 2
USER, PASSWORD = "svc", "e2e-pa55"
TABLE = "customers"


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> CertificateFiles:
    return make_certificates(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def registry(certificates: CertificateFiles) -> Iterator[SchemaRegistryDouble]:
    with SchemaRegistryDouble(auth=(USER, PASSWORD), tls=(certificates.server_cert, certificates.server_key)) as double:
        yield double


def _replay(records: dict[int, list[tuple]], decoder: ConfluentAvroDecoder) -> dict[int, dict]:
    """Apply decoded Debezium envelopes in partition order: the after image per key, deletes remove."""
    state: dict[int, dict] = {}
    for in_order in records.values():
        for _, raw_value, _ in in_order:
            envelope, _ = decoder.decode(raw_value)
            if envelope[Envelope.OP] == DebeziumOp.DELETE:
                state.pop(envelope[Envelope.BEFORE]["id"], None)
            else:
                state[envelope[Envelope.AFTER]["id"]] = envelope[Envelope.AFTER]
    return state


def test_avro_ingest_and_export_over_https_with_basic_auth(kafka_bootstrap, registry, certificates, unique, workdir,
                                                           monkeypatch):
    connection = RegistryConnection(registry.url, basic_auth=(USER, PASSWORD), ssl_ca_location=certificates.ca_cert)
    workload = DebeziumWorkload(f"avro.{unique}", PARTITIONS, "always", seed=11, with_timestamp=True)
    events = to_avro(workload.generate(EVENTS, KEYS), SchemaRegistryClient(connection=connection), with_timestamp=True)
    out, bad = f"out.{unique}", f"bad.{unique}"
    create_topics(kafka_bootstrap, [workload.topic], PARTITIONS)
    create_topics(kafka_bootstrap, [out, bad], 1)
    assert produce(kafka_bootstrap, events) >= EVENTS

    monkeypatch.setenv("REGISTRY_USER_INFO", f"{USER}:{PASSWORD}")
    shared = {"url": registry.url, "ssl.ca.location": certificates.ca_cert,
              "basic.auth.user.info": "${REGISTRY_USER_INFO}", "retries_wait_ms": 50}
    pipeline = {"name": f"in-{unique}", "topics": [workload.topic], "format": "avro-confluent", "table": TABLE,
                "primary_key": ["id"]}
    export = {"name": f"out-{unique}", "table": TABLE, "topic": out, "primary_key": ["id"], "preset": "debezium",
              "format": "avro-confluent", "tombstones": False}
    config = write_config(workdir / "config.yaml", kafka_bootstrap, workdir, [pipeline], exports=[export],
                          schema_registry=shared)
    first = run_cli(config, "--until-idle")
    assert first.returncode == 0, first.stderr[-3000:]
    assert PASSWORD not in first.stdout + first.stderr
    rows = table_rows(workdir / "tables" / TABLE)
    assert rows == workload.expected_rows()
    exported = _replay(consume_committed(kafka_bootstrap, out, 1), ConfluentAvroDecoder(SchemaRegistryClient(
        connection=connection)))
    assert exported == {row["id"]: {**exported[row["id"]], "email": row["email"]} for row in rows}

    # The bad export's value subject already holds a schema its envelope cannot read (no 'op').
    old = {"type": "record", "name": "Envelope", "fields": [{"name": "x", "type": "long"}]}
    SchemaRegistryClient(connection=connection).register(f"{bad}-value", old)
    export_bad = {**export, "name": f"bad-{unique}", "topic": bad}
    config = write_config(workdir / "config.yaml", kafka_bootstrap, workdir, [pipeline], exports=[export, export_bad],
                          schema_registry=shared)
    second = run_cli(config, "--until-idle")
    assert second.returncode != 0
    assert f"subject '{bad}-value' (latest version 1)" in second.stderr and "HTTP 409" in second.stderr
