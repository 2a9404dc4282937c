"""A record that cannot be decoded stops the pipeline with its coordinates; nothing of its
batch reaches the table, and a restart meets the same record again. Broken Confluent Avro
frames (short header, wrong magic byte, unknown schema id) each say what is wrong with them.

Registry: the Avro records are registered in and decoded through Apicurio Registry's ccompat API
(`apicurio_registry_url`); the unknown id is one that registry never assigned."""

from __future__ import annotations

import json
import logging

import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable

from connectors.schema_registry.avro_codec import ConfluentAvroEncoder
from connectors.schema_registry.avro_types import avro_name, debezium_envelope_schema
from connectors.schema_registry.client import SchemaRegistryClient
from connectors.schema_registry.wire_format import frame
from service.config.settings import settings_from_mapping
from service.operations.workload import create_topics
from service.supervisor.runner import Runner
from tests.support.pipeline_harness import table_rows, table_version
from vocabulary.errors import DecodeError

BAD_VALUES = {
    "not-json": (b"{not json pii-secret", "not valid JSON"),
    "no-op": (json.dumps({"before": None, "after": {"id": 5, "name": "pii-secret"}}).encode(), "no 'op'"),
    "unknown-op": (json.dumps({"before": None, "after": {"id": 5, "name": "pii-secret"}, "op": "z"}).encode(),
                   "'z'"),
}


def _envelope(op: str, row: dict, before: dict | None = None) -> bytes:
    return json.dumps({"before": before, "after": row if op != "d" else None, "op": op}).encode()


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, key=b'{"id":0}', value=value, partition=0)
    assert producer.flush(30) == 0


def _run(spark, bootstrap: str, topic: str, workdir, **pipeline) -> None:
    settings = settings_from_mapping({
        "kafka": {"bootstrap_servers": bootstrap},
        "lakehouse": {"root": str(workdir / "tables")},
        "checkpoint_root": str(workdir / "checkpoints"),
        "pipelines": [{"name": "bad", "topics": [topic], "table": "t", "primary_key": ["id"], **pipeline}],
    })
    runner = Runner(settings)
    runner.start(until_idle=True)
    runner.wait()


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_bad_record_stops_with_coordinates_and_commits_nothing_after_it(spark, kafka_bootstrap, unique,
                                                                       workdir, case):
    topic = f"bad-{case}-{unique}"
    create_topics(kafka_bootstrap, [topic], 2)
    _produce(kafka_bootstrap, topic, [_envelope("c", {"id": 1, "name": "a"}), _envelope("c", {"id": 2, "name": "b"})])
    _run(spark, kafka_bootstrap, topic, workdir)
    uri = workdir / "tables" / "t"
    before = table_rows(uri)
    version = table_version(uri)
    bad_value, reason = BAD_VALUES[case]
    _produce(kafka_bootstrap, topic, [_envelope("u", {"id": 1, "name": "a2"}), bad_value,
                                      _envelope("c", {"id": 3, "name": "c"})])
    for _attempt in range(2):  # a restart stops at the same record: its offset was never committed
        with pytest.raises(DecodeError) as raised:
            _run(spark, kafka_bootstrap, topic, workdir)
        message = str(raised.value)
        assert f"topic={topic} partition=0 offset=3" in message
        assert reason in message
        assert "pii-secret" not in message and "not json" not in message, "payloads must not leak into errors"
        assert table_rows(uri) == before == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
        assert table_version(uri) == version


SECRET = "pii-secret"
# partition -> (a broken Confluent Avro value, what its error says)
BROKEN_FRAMES = {
    0: (b"\x00\x00\x01", "Confluent Avro frame is 3 bytes long, shorter than its 5-byte header"),
    1: (json.dumps({"after": {"id": 7, "name": SECRET}}).encode(), "starts with byte 0x7b, not the magic byte 0x00"),
    2: (frame(987_654, b"\x02" + SECRET.encode()), "schema id 987654 is unknown to the schema registry"),
}


def _produce_avro(bootstrap: str, registry_url: str, topic: str) -> list[dict]:
    """Per partition: a good Avro change, a broken frame (offset 1), a good one; the good rows."""
    schema = debezium_envelope_schema(avro_name(topic), {"id": "int64", "name": "string"}, required=("id",))
    encoder = ConfluentAvroEncoder(SchemaRegistryClient(registry_url), f"{topic}-value", schema)
    producer = Producer({"bootstrap.servers": bootstrap})
    good = []
    for partition, (broken, _) in BROKEN_FRAMES.items():
        rows = [{"id": partition * 10 + n, "name": f"row-{partition}-{n}"} for n in range(2)]
        values = [encoder.encode({"before": None, "after": rows[0], "op": "c", "ts_ms": 1}), broken,
                  encoder.encode({"before": None, "after": rows[1], "op": "c", "ts_ms": 2})]
        for value in values:
            producer.produce(topic, key=json.dumps({"id": partition}).encode(), value=value, partition=partition)
        good += rows
    assert producer.flush(30) == 0
    return good


def test_broken_avro_frames_fail_or_are_logged_each_with_its_reason_and_coordinates(
        spark, kafka_bootstrap, apicurio_registry_url, unique, workdir, caplog):
    topic = f"bad-avro-{unique}"
    create_topics(kafka_bootstrap, [topic], len(BROKEN_FRAMES))
    good = _produce_avro(kafka_bootstrap, apicurio_registry_url, topic)
    avro = {"format": "avro-confluent", "schema_registry": {"url": apicurio_registry_url}}
    with pytest.raises(DecodeError) as raised:
        _run(spark, kafka_bootstrap, topic, workdir / "fail", **avro)
    message = str(raised.value)
    assert f"topic={topic} partition=0 offset=1" in message and BROKEN_FRAMES[0][1] in message, message
    assert "2 more bad record(s)" in message and SECRET not in message
    assert not DeltaTable.is_deltatable(str(workdir / "fail" / "tables" / "t"))

    logged = {**avro, "from_changelog": {"preset": "debezium", "decode_error_handling": "LOG"}}
    with caplog.at_level(logging.WARNING, logger="service.kafka_to_delta.sink.bad_records"):
        _run(spark, kafka_bootstrap, topic, workdir / "log", **logged)
    assert table_rows(workdir / "log" / "tables" / "t") == sorted(good, key=lambda row: row["id"])
    warnings = [r.getMessage() for r in caplog.records if "dropped a bad record" in r.getMessage()]
    assert len(warnings) == len(BROKEN_FRAMES), warnings
    for partition, (_, reason) in BROKEN_FRAMES.items():
        where = f"topic={topic} partition={partition} offset=1"
        assert [w for w in warnings if where in w and reason in w], (where, reason, warnings)
    assert SECRET not in caplog.text
