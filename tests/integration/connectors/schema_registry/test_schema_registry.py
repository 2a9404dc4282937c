"""Schema Registry client, Confluent Avro encoder/decoder and the Avro workload, over real HTTP.

Registries: ids, subjects, versions, refusals (40403, 40401, 42201), the codec and the workload run
against Apicurio Registry's ccompat API (`apicurio_registry_url`, a real Confluent-compatible
server). The in-repo double (`registry`) serves only what a real server cannot show on demand:
counting requests (the client's caches), injected HTTP 500s (retries) and basic auth (Apicurio's
authentication needs an OpenID Connect server). The unreachable and silent registries are sockets.
"""

from __future__ import annotations

import json
import pickle
import socket
import threading
from typing import Iterator

import pytest

from connectors.delta.connect_types import connect_schema_to_types
from connectors.schema_registry.avro_codec import ConfluentAvroDecoder, ConfluentAvroEncoder
from connectors.schema_registry.avro_types import avro_schema_for, debezium_envelope_schema
from connectors.schema_registry.client import SchemaRegistryClient
from connectors.schema_registry.connection import RegistryConnection
from connectors.schema_registry.errors import (
    AvroBodyError,
    BadMagicByteError,
    SchemaRegistryRequestError,
    SchemaRegistryUnavailable,
    ShortFrameError,
    SubjectNotFoundError,
    UnknownSchemaIdError,
)
from connectors.schema_registry.wire_format import frame
from service.operations.workload import DebeziumWorkload
from testbed.avro_workload import to_avro, workload_column_types
from tests.support.schema_registry_double import GET_SCHEMA, REGISTER, SchemaRegistryDouble
from vocabulary.changes import Envelope
from vocabulary.errors import DecodeError, SourceCoordinates, TransientError

COLUMNS = {"id": "int64", "email": "string", "price": "decimal(10,2)", "born": "date32", "at": "timestamp_us_utc"}
WHERE = SourceCoordinates("users", 0, 17, '{"id":1}')
SECRET = "s3cr3t-personal-data"


@pytest.fixture(scope="module")
def registry() -> Iterator[SchemaRegistryDouble]:
    with SchemaRegistryDouble() as double:
        yield double


@pytest.fixture
def client(apicurio_registry_url: str) -> SchemaRegistryClient:
    return SchemaRegistryClient(apicurio_registry_url, timeout=30)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_register_assigns_ids_once_per_schema(client: SchemaRegistryClient, unique: str) -> None:
    first = avro_schema_for("A", {"id": "int64"}, namespace=f"n{unique}")
    second = avro_schema_for("A", {"id": "int64", "x": "string"}, namespace=f"n{unique}")
    id_first = client.register(f"{unique}-value", first)
    assert client.register(f"{unique}-value", json.dumps(first, indent=2)) == id_first  # same schema, other text
    assert SchemaRegistryClient(client.url).register(f"{unique}-other", first) == id_first
    id_second = client.register(f"{unique}-value", second)
    assert id_second > id_first
    latest = client.latest(f"{unique}-value")
    assert (latest.schema_id, latest.version, latest.subject) == (id_second, 2, f"{unique}-value")
    assert latest.definition == second and client.schema_by_id(id_first).definition == first


def test_lookups_are_cached_by_id_and_by_subject_and_text(registry: SchemaRegistryDouble, unique: str) -> None:
    client = SchemaRegistryClient(registry.url)
    before = dict(registry.requests)
    schema = avro_schema_for("C", {"id": "int64"}, namespace=f"c{unique}")
    schema_id = client.register(f"{unique}-value", schema)
    client.register(f"{unique}-value", schema)
    fetched = {client.schema_by_id(schema_id).parsed["name"] for _ in range(3)}
    assert fetched == {f"c{unique}.C"}
    assert registry.requests[REGISTER] - before.get(REGISTER, 0) == 1
    assert registry.requests[GET_SCHEMA] - before.get(GET_SCHEMA, 0) == 1


def test_concurrent_lookups_fetch_a_schema_once(registry: SchemaRegistryDouble, unique: str) -> None:
    schema_id = SchemaRegistryClient(registry.url).register(unique, avro_schema_for("T", {"a": "int32"}))
    client, before = SchemaRegistryClient(registry.url), registry.requests[GET_SCHEMA]
    seen: list[int] = []
    threads = [threading.Thread(target=lambda: seen.append(client.schema_by_id(schema_id).schema_id))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == [schema_id] * 8 and registry.requests[GET_SCHEMA] - before == 1


def test_registry_refusals(client: SchemaRegistryClient, unique: str) -> None:
    with pytest.raises(UnknownSchemaIdError) as unknown:
        client.schema_by_id(999_999)
    assert unknown.value.schema_id == 999_999 and client.url in str(unknown.value)
    with pytest.raises(SubjectNotFoundError) as missing:
        client.latest(f"{unique}-nothing")
    assert (missing.value.status, missing.value.error_code) == (404, 40401)
    with pytest.raises(SchemaRegistryRequestError) as invalid:
        client.register(unique, {"type": "no-such-type"})
    assert (invalid.value.status, invalid.value.error_code) == (422, 42201)


def test_unreachable_registry_is_transient() -> None:
    client = SchemaRegistryClient(connection=RegistryConnection(f"http://127.0.0.1:{_free_port()}", max_retries=0))
    with pytest.raises(SchemaRegistryUnavailable) as caught:
        client.schema_by_id(1)
    assert isinstance(caught.value, TransientError) and not isinstance(caught.value, DecodeError)
    with pytest.raises(SchemaRegistryUnavailable):
        ConfluentAvroDecoder(client).decode(frame(1, b"\x02"))


def test_a_registry_that_never_answers_times_out_as_transient() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)  # accepts the connection in the kernel, never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        client = SchemaRegistryClient(connection=RegistryConnection(url, timeout_seconds=0.5, max_retries=0))
        with pytest.raises(SchemaRegistryUnavailable, match="Timeout"):
            client.schema_by_id(1)


def test_server_errors_are_retried_then_transient(registry: SchemaRegistryDouble, unique: str) -> None:
    schema_id = SchemaRegistryClient(registry.url).register(unique, avro_schema_for("S", {"a": "int64"}))
    before = registry.requests[GET_SCHEMA]
    registry.fail_next(2)
    retrying = SchemaRegistryClient(connection=RegistryConnection(registry.url, max_retries=2, retries_wait_ms=10))
    assert retrying.schema_by_id(schema_id).schema_id == schema_id  # two 500s absorbed by the retries
    assert registry.requests[GET_SCHEMA] - before == 3
    registry.fail_next()
    fresh = SchemaRegistryClient(connection=RegistryConnection(registry.url, max_retries=0))
    with pytest.raises(SchemaRegistryUnavailable, match="HTTP 500"):
        fresh.schema_by_id(schema_id)
    assert fresh.schema_by_id(schema_id).schema_id == schema_id


def test_basic_auth() -> None:
    with SchemaRegistryDouble(auth=("svc", "pa55word")) as secured:
        with pytest.raises(SchemaRegistryRequestError) as refused:
            SchemaRegistryClient(secured.url).register("s", "\"string\"")
        assert refused.value.status == 401
        client = SchemaRegistryClient(secured.url, auth=("svc", "pa55word"))
        assert client.schema_by_id(client.register("s", "\"string\"")).definition == "string"


def test_encoder_and_decoder_round_trip_over_http(apicurio_registry_url: str, unique: str) -> None:
    schema = debezium_envelope_schema(f"db{unique}.users", COLUMNS, source={"lsn": "int64", "db": "string"})
    encoder = ConfluentAvroEncoder(SchemaRegistryClient(apicurio_registry_url), f"{unique}-value", schema)
    envelope = {"before": None, "after": {"id": 1, "email": SECRET, "price": "MDk=", "born": 19_000, "at": 5},
                "source": {"lsn": 42, "db": "shop"}, "op": "c", "ts_ms": 1_790_000_000_000}
    value = encoder.encode(envelope)
    assert value[0] == 0 and int.from_bytes(value[1:5], "big") == encoder.schema_id
    decoder = ConfluentAvroDecoder(SchemaRegistryClient(apicurio_registry_url))
    assert decoder.decode(value) == (envelope, COLUMNS)
    assert decoder(None) == (None, None) and encoder.encode(None) is None
    revived = pickle.loads(pickle.dumps(decoder))  # as on a Spark worker: caches rebuilt there
    assert revived.decode(value) == (envelope, COLUMNS)


def test_decode_errors_are_distinct_and_locatable(apicurio_registry_url: str, unique: str) -> None:
    decoder = ConfluentAvroDecoder(SchemaRegistryClient(apicurio_registry_url))
    with pytest.raises(ShortFrameError):
        decoder.decode(b"\x00\x00\x01")
    with pytest.raises(BadMagicByteError):
        decoder.decode(json.dumps({"email": SECRET}).encode())
    with pytest.raises(UnknownSchemaIdError) as unknown:
        decoder.decode(frame(888_888, b""))
    located = unknown.value.at(WHERE)
    assert isinstance(located, UnknownSchemaIdError) and "offset=17" in str(located)
    assert "schema id 888888" in str(located) and apicurio_registry_url in str(located)
    schema_id = SchemaRegistryClient(apicurio_registry_url).register(unique, avro_schema_for("R", {"email": "string"}))
    with pytest.raises(AvroBodyError) as body:
        decoder.decode(frame(schema_id, b"\x02\x50" + SECRET.encode()[:3]))
    assert f"schema id {schema_id}" in str(body.value) and SECRET[:3] not in str(body.value)


def _json_view(value: bytes) -> tuple[dict, dict[str, str]]:
    """What the JSON decoder sees: the payload and the column types of the schema block."""
    document = json.loads(value)
    return document[Envelope.PAYLOAD], connect_schema_to_types(document[Envelope.SCHEMA])


@pytest.mark.parametrize("with_timestamp", [True, False])
def test_avro_workload_decodes_like_the_json_workload(apicurio_registry_url: str, unique: str,
                                                      with_timestamp: bool) -> None:
    workload = DebeziumWorkload(f"w{unique}", 3, "always", seed=7, with_timestamp=with_timestamp)
    events = workload.generate(300, 40)
    avro_events = to_avro(events, SchemaRegistryClient(apicurio_registry_url), with_timestamp=with_timestamp)
    decoder = ConfluentAvroDecoder(SchemaRegistryClient(apicurio_registry_url))
    assert len(avro_events) == len(events)
    for json_event, avro_event in zip(events, avro_events):
        assert (avro_event.topic, avro_event.partition, avro_event.key) == (
            json_event.topic, json_event.partition, json_event.key)
        if json_event.value is None:
            assert avro_event.value is None
            continue
        assert decoder.decode(avro_event.value) == _json_view(json_event.value)
    assert len(avro_events[0].value) * 5 < len(events[0].value)


def test_avro_keys_decode_to_the_json_keys(apicurio_registry_url: str, unique: str) -> None:
    events = DebeziumWorkload(f"k{unique}", 2, "never", seed=3).generate(40, 10)
    avro_events = to_avro(events, SchemaRegistryClient(apicurio_registry_url), key_format="avro")
    decoder = ConfluentAvroDecoder(SchemaRegistryClient(apicurio_registry_url))
    for json_event, avro_event in zip(events, avro_events):
        assert decoder.decode(avro_event.key) == (json.loads(json_event.key), {"id": "int64"})
        if json_event.value is not None:
            assert decoder.decode(avro_event.value)[0] == json.loads(json_event.value)
    assert workload_column_types(False) == {"id": "int64", "name": "string", "email": "string",
                                            "balance": "float64", "active": "bool"}


def test_a_wrong_registry_path_is_not_an_unknown_schema_id(apicurio_registry_url: str) -> None:
    with pytest.raises(SchemaRegistryRequestError) as caught:
        SchemaRegistryClient(apicurio_registry_url + "/not-the-registry").schema_by_id(1)
    assert caught.value.status == 404 and not isinstance(caught.value, DecodeError)
