"""A record that cannot be decoded stops the pipeline with its coordinates; nothing of its
batch reaches the table, and a restart meets the same record again."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer

from service.errors import DecodeError
from service.runner import Runner
from service.settings import settings_from_mapping
from service.workload import create_topics
from tests.pipeline_harness import table_rows, table_version

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


def _run(spark, bootstrap: str, topic: str, workdir) -> None:
    settings = settings_from_mapping({
        "kafka": {"bootstrap_servers": bootstrap},
        "lakehouse": {"root": str(workdir / "tables")},
        "checkpoint_root": str(workdir / "checkpoints"),
        "pipelines": [{"name": "bad", "topics": [topic], "table": "t", "primary_key": ["id"]}],
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
