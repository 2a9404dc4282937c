"""Avro export and ingest through `confluent_kafka.schema_registry` over HTTPS (a CA made here
signs the certificate) with basic auth; schema references; credentials in a URL refused; secrets
masked; the BACKWARD check refusing an incompatible schema change, and compatibility NONE.

Registries: the HTTPS and auth tests use the in-repo double, which serves HTTPS with basic or
bearer auth and client certificates (Apicurio Registry authenticates only through an OpenID
Connect server, which this machine does not have). The compatibility and reference tests use
Apicurio Registry (`apicurio_registry_url`): its BACKWARD rule (the launcher's global default, as
Confluent's) answers 409 for real, a subject set to NONE accepts anything, and it resolves
references by subject and version.
"""

from __future__ import annotations

import io
import json
import pickle
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import fastavro
import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaReference
from deltalake import write_deltalake

from connectors.kafka.range_reader import RAW_SCHEMA
from connectors.schema_registry.avro_codec import ConfluentAvroDecoder
from connectors.schema_registry.client import SchemaRegistryClient
from connectors.schema_registry.connection import RegistryConnection
from connectors.schema_registry.errors import (
    IncompatibleSchemaError,
    SchemaRegistryRequestError,
    SchemaRegistryUnavailable,
)
from connectors.schema_registry.wire_format import frame
from service.config.exports import ExportSettings
from service.config.registry import SchemaRegistrySettings
from service.config.settings import PipelineSettings, Settings, settings_from_mapping
from service.delta_to_kafka.formats.avro_serializers import avro_serializers
from service.kafka_to_delta.rows.names import Column
from service.kafka_to_delta.source.decode_stage import batch_decoder
from tests.support.registry_tls import CertificateFiles, make_certificates
from tests.support.schema_registry_double import GET_SCHEMA, SchemaRegistryDouble
from vocabulary.changes import Envelope
from vocabulary.errors import ConfigError

USER, PASSWORD = "svc", "pa55-w0rd"
CDF_ON = {"delta.enableChangeDataFeed": "true"}
SOURCE = {"connector": "c", "name": "e", "table": "users", "version": 1, "ts_ms": 0}


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> CertificateFiles:
    return make_certificates(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def registry(certificates: CertificateFiles) -> Iterator[SchemaRegistryDouble]:
    tls = (certificates.server_cert, certificates.server_key)
    with SchemaRegistryDouble(auth=(USER, PASSWORD), tls=tls) as double:
        yield double


@pytest.fixture
def block(registry: SchemaRegistryDouble, certificates: CertificateFiles) -> dict:
    """A `schema_registry:` block as a config file gives it (confluent's dotted names)."""
    return {"url": registry.url, "ssl.ca.location": certificates.ca_cert,
            "basic.auth.user.info": f"{USER}:{PASSWORD}", "retries_wait_ms": 10}


def _export(unique: str, uri: str, block: dict) -> tuple:
    export = ExportSettings(name="e", table="users", topic=f"users.{unique}", primary_key=("id",),
                            preset="debezium", format="avro-confluent", schema_registry=block)
    return avro_serializers(export, uri, {})


def _kafka_batch(topic: str, keys: list[bytes], values: list[bytes]) -> pa.RecordBatch:
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    rows = {"key": keys, "value": values, "topic": [topic] * len(keys), "partition": [0] * len(keys),
            "offset": list(range(len(keys))), "timestamp": [at] * len(keys), "headers": [[]] * len(keys)}
    return pa.RecordBatch.from_pydict(rows, schema=RAW_SCHEMA)


def test_avro_export_then_ingest_over_https_with_basic_auth(registry: SchemaRegistryDouble, block: dict,
                                                            unique: str, workdir: Path) -> None:
    uri = str(workdir / "users")
    write_deltalake(uri, pa.table({"id": [1, 2], "email": ["a@x.io", "b@x.io"]}), configuration=CDF_ON)
    keys, values = _export(unique, uri, block)
    records = [(keys.encode({"id": i}), values.encode({Envelope.BEFORE: None, Envelope.AFTER: {"id": i, "email": e},
                                                       Envelope.SOURCE: SOURCE, Envelope.OP: "c"}))
               for i, e in ((1, "a@x.io"), (2, "b@x.io"))]
    assert all(value[0] == 0 for _, value in records)  # Confluent framing

    pipeline = PipelineSettings(name="p", topics=(f"users.{unique}",), format="avro-confluent", table="users",
                                primary_key=("id",), schema_registry=block)
    fetched = registry.requests[GET_SCHEMA]
    decoder = pickle.loads(pickle.dumps(batch_decoder(pipeline)))  # as shipped to an executor
    decoded = decoder(_kafka_batch(f"users.{unique}", [k for k, _ in records], [v for _, v in records]))
    rows = [json.loads(row) for row in decoded.column(Column.ROW).to_pylist()]
    assert rows == [{"id": 1, "email": "a@x.io"}, {"id": 2, "email": "b@x.io"}]
    assert decoded.column(Column.ERROR).to_pylist() == [None, None]
    assert registry.requests[GET_SCHEMA] > fetched  # the executor's own client fetched the schema


def test_tls_and_auth_failures(registry: SchemaRegistryDouble, certificates: CertificateFiles) -> None:
    untrusted = SchemaRegistryClient(connection=RegistryConnection(registry.url, basic_auth=(USER, PASSWORD),
                                                                   max_retries=0))
    with pytest.raises(SchemaRegistryUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        untrusted.schema_by_id(1)
    wrong = RegistryConnection(registry.url, basic_auth=(USER, "nope"), ssl_ca_location=certificates.ca_cert)
    with pytest.raises(SchemaRegistryRequestError) as refused:
        SchemaRegistryClient(connection=wrong).register("s", '"string"')
    assert (refused.value.status, refused.value.error_code) == (401, 40101)


def test_client_certificates_and_bearer_auth(certificates: CertificateFiles, unique: str) -> None:
    tls = (certificates.server_cert, certificates.server_key)
    with SchemaRegistryDouble(tls=tls, client_ca=certificates.ca_cert, bearer_token="t0ken") as mutual:
        block = {"url": mutual.url, "ssl.ca.location": certificates.ca_cert, "bearer.auth.token": "t0ken",
                 "bearer.auth.logical.cluster": "lsrc-1", "max_retries": 0}
        anonymous = SchemaRegistryClient(connection=SchemaRegistrySettings(**block).connection())
        with pytest.raises(SchemaRegistryUnavailable):  # the TLS handshake wants a client certificate
            anonymous.register(unique, '"string"')
        presented = {**block, "ssl.certificate.location": certificates.client_cert,
                     "ssl.key.location": certificates.client_key}
        client = SchemaRegistryClient(connection=SchemaRegistrySettings(**presented).connection())
        assert client.schema_by_id(client.register(unique, '"string"')).definition == "string"
        wrong = SchemaRegistrySettings(**{**presented, "bearer.auth.token": "other"}).connection()
        with pytest.raises(SchemaRegistryRequestError) as refused:
            SchemaRegistryClient(connection=wrong).register(unique, '"long"')
        assert refused.value.status == 401 and "t0ken" not in repr(SchemaRegistrySettings(**presented))


def test_an_incompatible_schema_change_is_refused_with_subject_and_version(
        apicurio_registry_url: str, unique: str, workdir: Path) -> None:
    block = {"url": apicurio_registry_url}
    uri = str(workdir / "users")
    write_deltalake(uri, pa.table({"id": [1], "email": ["a@x.io"]}), configuration=CDF_ON)
    _, values = _export(unique, uri, block)
    envelope = {Envelope.BEFORE: None, Envelope.SOURCE: SOURCE, Envelope.OP: "c"}
    values.encode({**envelope, Envelope.AFTER: {"id": 1, "email": "a@x.io"}})
    # The table's email column changes type (long cannot read a string); the export restarts.
    write_deltalake(uri, pa.table({"id": [2], "email": [7]}), mode="overwrite", schema_mode="overwrite")
    _, restarted = _export(unique, uri, block)
    with pytest.raises(IncompatibleSchemaError) as refused:
        restarted.encode({**envelope, Envelope.AFTER: {"id": 2, "email": 7}})
    assert (refused.value.subject, refused.value.version) == (f"users.{unique}-value", 1)
    assert f"subject 'users.{unique}-value' (latest version 1)" in str(refused.value)
    assert "HTTP 409" in str(refused.value)
    assert SchemaRegistryClient(apicurio_registry_url).latest(f"users.{unique}-value").version == 1


def test_compatible_changes_and_compatibility_none(apicurio_registry_url: str, unique: str) -> None:
    old = {"type": "record", "name": "R", "namespace": f"n{unique}", "fields": [{"name": "id", "type": "long"}]}
    added = {**old, "fields": [*old["fields"], {"name": "x", "type": ["null", "string"], "default": None}]}
    required = {**old, "fields": [*old["fields"], {"name": "y", "type": "string"}]}
    client = SchemaRegistryClient(apicurio_registry_url)
    assert client.register(f"backward-{unique}", old) < client.register(f"backward-{unique}", added)
    with pytest.raises(IncompatibleSchemaError):
        client.register(f"backward-{unique}", required)  # a new field without a default cannot read old data
    assert client.latest(f"backward-{unique}").version == 2
    client.confluent.set_compatibility(f"none-{unique}", "NONE")
    client.register(f"none-{unique}", old)
    assert client.latest(f"none-{unique}").version == 1 and client.register(f"none-{unique}", required) > 0
    assert client.latest(f"none-{unique}").version == 2


def test_schema_references_are_resolved(apicurio_registry_url: str, unique: str) -> None:
    client = SchemaRegistryClient(connection=SchemaRegistrySettings(url=apicurio_registry_url).connection())
    address = {"type": "record", "name": "Address", "namespace": f"n{unique}",
               "fields": [{"name": "city", "type": "string"}]}
    client.register(f"address-{unique}", address)
    user = {"type": "record", "name": "User", "namespace": f"n{unique}",
            "fields": [{"name": "id", "type": "long"}, {"name": "home", "type": f"n{unique}.Address"},
                       {"name": "work", "type": ["null", f"n{unique}.Address"], "default": None}]}
    reference = {"name": f"n{unique}.Address", "subject": f"address-{unique}", "version": 1}
    schema_id = client.register(f"user-{unique}", user, [SchemaReference(**reference)])
    record = {"id": 1, "home": {"city": "Rom"}, "work": {"city": "Oslo"}}
    body = io.BytesIO()
    fastavro.schemaless_writer(body, client.schema_by_id(schema_id).parsed, record)
    fresh = ConfluentAvroDecoder(SchemaRegistryClient(connection=client.connection))
    document, types = fresh.decode(frame(schema_id, body.getvalue()))
    assert document == record
    assert types is not None and types["id"] == "int64"


def test_credentials_in_the_url_are_refused_and_secrets_are_masked(block: dict) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from_mapping({"schema_registry": {"url": f"https://{USER}:{PASSWORD}@registry.example:8081"}})
    assert "schema_registry.url: Value error, schema registry url 'https://registry.example:8081' carries " \
           "credentials" in str(caught.value) and PASSWORD not in str(caught.value)
    with pytest.raises(ValueError, match="carries credentials"):
        RegistryConnection(f"https://{USER}:{PASSWORD}@registry.example:8081")
    settings = Settings(schema_registry={**block, "bearer_auth_token": None},
                        pipelines=[{"name": "p", "topics": ["t"], "format": "avro-confluent", "table": "t",
                                    "primary_key": ["id"]}],
                        exports=[{"name": "e", "table": "t", "topic": "out", "primary_key": ["id"],
                                  "format": "avro-confluent"}])
    assert settings.pipelines[0].schema_registry == settings.exports[0].schema_registry == settings.schema_registry
    assert settings.exports[0].schema_registry.basic_auth == (USER, PASSWORD)
    shown = repr(settings) + settings.model_dump_json()
    assert PASSWORD not in shown and PASSWORD not in repr(settings.schema_registry.connection())
