"""DeadLetterSink against the real broker (read back read_committed) and a real Delta table (deltalake)."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import DeltaTable
from pydantic import ValidationError

from service.config.dead_letters import DeadLetterSettings
from service.kafka_to_delta.rows.names import Stage
from service.kafka_to_delta.sink.dead_letters import (
    HEADERS_TYPE,
    DeadLetterError,
    DeadLetterSink,
    DlqHeader,
)
from tests.support.pipeline_harness import read_committed
from vocabulary.errors import ConfigError

PIPELINE = "orders"
SECRET = b"SECRET-PAYLOAD"
T0_MS = 1_700_000_000_123
LETTERS = [
    {   # null key, value not UTF-8, headers whose values are not UTF-8 either
        "raw_key": None, "raw_value": b"\xff\xfe\x00\x80" + SECRET, "topic": "in.orders", "partition": 2,
        "offset": 41, "timestamp": T0_MS, "stage": Stage.DECODE.value, "error": "value is not JSON",
        "headers": [{"key": "trace", "value": b"\xc3\x28"}, {"key": "__debezium.newkey", "value": b"{}"}],
    },
    {
        "raw_key": b"\x00\x01k\xff", "raw_value": b'{"op":"x"}', "topic": "in.orders", "partition": 0,
        "offset": 7, "timestamp": T0_MS + 5, "stage": Stage.FROM_CHANGELOG.value,
        "error": "op code 'x' is not in op_mapping", "headers": None,
    },
]


def _input(letters: list[dict]) -> pa.Table:
    """Error rows as the pipeline hands them over: timestamp in ms, and columns the sink ignores."""
    return pa.table({
        "raw_key": pa.array([r["raw_key"] for r in letters], pa.binary()),
        "raw_value": pa.array([r["raw_value"] for r in letters], pa.binary()),
        "headers": pa.array([r["headers"] for r in letters], HEADERS_TYPE),
        "topic": pa.array([r["topic"] for r in letters], pa.string()),
        "partition": pa.array([r["partition"] for r in letters], pa.int32()),
        "offset": pa.array([r["offset"] for r in letters], pa.int64()),
        "timestamp": pa.array([r["timestamp"] for r in letters], pa.int64()),
        "stage": pa.array([r["stage"] for r in letters], pa.string()),
        "error": pa.array([r["error"] for r in letters], pa.string()),
        "handling": pa.array(["DEAD_LETTER"] * len(letters), pa.string()),
    })


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


# --- settings and input -------------------------------------------------------------------------


def test_settings_need_a_topic_or_a_table_and_reject_unknown_keys():
    assert DeadLetterSettings(topic="dlq").table is None
    both = DeadLetterSettings(table="dead_letters", topic="dlq")
    assert both.positions_topic == "cdc-lakehouse.dead-letter-positions"
    with pytest.raises(ValidationError, match="needs a `topic`, a `table` or both"):
        DeadLetterSettings()
    with pytest.raises(ValidationError, match="extra"):
        DeadLetterSettings(topic="dlq", tpoic="x")
    with pytest.raises(ValidationError, match="pattern"):
        DeadLetterSettings(table="../escape")
    with pytest.raises(ConfigError, match="orders: dead_letters.topic needs the Kafka client configuration"):
        DeadLetterSink(DeadLetterSettings(topic="dlq"), PIPELINE)


def test_rows_without_the_original_bytes_are_refused(tmp_path):
    sink = DeadLetterSink(DeadLetterSettings(table="dl"), PIPELINE, table_uri=str(tmp_path / "dl"))
    with pytest.raises(DeadLetterError, match=r"lack column\(s\) \['raw_value'\]"):
        sink.store(_input(LETTERS).drop_columns(["raw_value"]), 0)
    assert sink.store(_input([]), 0) == 0


# --- Delta ---------------------------------------------------------------------------------------


def test_delta_keeps_bytes_headers_and_metadata_and_skips_a_replayed_batch(tmp_path, caplog):
    uri = str(tmp_path / "dead_letters")
    with_null_value = {**LETTERS[1], "raw_value": None, "offset": 8}
    letters = [*LETTERS, with_null_value]
    before = datetime.now(timezone.utc)
    sink = DeadLetterSink(DeadLetterSettings(table="dead_letters"), PIPELINE, table_uri=uri)
    with caplog.at_level(logging.DEBUG):
        assert sink.store(_input(letters), 3) == 3
    assert SECRET.decode() not in caplog.text and "decode: 1, from_changelog: 2" in caplog.text

    stored = sorted(DeltaTable(uri).to_pyarrow_table().to_pylist(), key=lambda r: (r["partition"], r["offset"]))
    expected = sorted(letters, key=lambda r: (r["partition"], r["offset"]))
    assert [(r["key"], r["value"], r["headers"]) for r in stored] == [
        (e["raw_key"], e["raw_value"], e["headers"]) for e in expected
    ]
    for row, letter in zip(stored, expected):
        where = (letter["topic"], letter["partition"], letter["offset"])
        assert (row["topic"], row["partition"], row["offset"]) == where
        assert row["timestamp"] == datetime.fromtimestamp(letter["timestamp"] / 1000, timezone.utc)
        assert (row["stage"], row["error"], row["pipeline"], row["batch_id"]) == (
            letter["stage"], letter["error"], PIPELINE, 3)
        assert before <= row["stored_at"] <= datetime.now(timezone.utc) + timedelta(seconds=1)
    assert DeltaTable(uri).transaction_version(sink.default_app_id()) == 3

    version = DeltaTable(uri).version()
    restarted = DeadLetterSink(DeadLetterSettings(table="dead_letters"), PIPELINE, table_uri=uri)
    assert restarted.store(_input(letters), 3) == 0  # a replay: nothing stored twice
    assert restarted.store(_input(letters[:1]), 2) == 0  # older batches too
    assert DeltaTable(uri).version() == version and DeltaTable(uri).to_pyarrow_table().num_rows == 3
    assert restarted.store(_input(letters[:1]), 4) == 1
    assert restarted.store(_input(letters[:1]), 0, app_id="cdc-lakehouse/orders/t/query-2") == 1
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 5


# --- Kafka ---------------------------------------------------------------------------------------


def test_kafka_keeps_bytes_and_headers_adds_metadata_and_skips_a_replayed_batch(kafka_bootstrap, unique, tmp_path):
    topic, positions = f"dlq-{unique}", f"dlq-positions-{unique}"
    _create_topic(kafka_bootstrap, topic, 2)
    settings = DeadLetterSettings(topic=topic, positions_topic=positions, table="dead_letters")
    config = {"bootstrap.servers": kafka_bootstrap}
    uri = str(tmp_path / "dead_letters")
    before_ms = int(time.time() * 1000)
    sink = DeadLetterSink(settings, PIPELINE, kafka_config=config, table_uri=uri)
    try:
        assert sink.store(_input(LETTERS), 11) == 2
    finally:
        sink.close()

    records = {int(dict(m.headers())[DlqHeader.OFFSET]): m for m in read_committed(kafka_bootstrap, topic)}
    assert sorted(records) == [7, 41]
    for letter in LETTERS:
        message = records[letter["offset"]]
        assert message.key() == letter["raw_key"] and message.value() == letter["raw_value"]
        headers = message.headers()
        original = [(h["key"], h["value"]) for h in letter["headers"] or []]
        assert headers[:len(original)] == original  # original headers first, unchanged
        metadata = dict(headers[len(original):])
        assert {k: v for k, v in metadata.items() if k != DlqHeader.STORED_AT} == {
            DlqHeader.TOPIC: letter["topic"].encode(), DlqHeader.PARTITION: str(letter["partition"]).encode(),
            DlqHeader.OFFSET: str(letter["offset"]).encode(), DlqHeader.TIMESTAMP: str(letter["timestamp"]).encode(),
            DlqHeader.STAGE: letter["stage"].encode(), DlqHeader.ERROR: letter["error"].encode(),
            DlqHeader.PIPELINE: PIPELINE.encode(), DlqHeader.BATCH: b"11",
        }
        assert before_ms <= int(metadata[DlqHeader.STORED_AT]) <= int(time.time() * 1000)
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 2

    restarted = DeadLetterSink(settings, PIPELINE, kafka_config=config, table_uri=uri)
    try:
        assert restarted.store(_input(LETTERS), 11) == 0  # position read back from Kafka: skipped
        assert len(read_committed(kafka_bootstrap, topic)) == 2
        assert restarted.store(_input(LETTERS[:1]), 12) == 1
        assert restarted.store(_input(LETTERS[:1]), 12) == 0  # the same instance remembers it too
    finally:
        restarted.close()
    after = read_committed(kafka_bootstrap, topic)
    assert len(after) == 3 and sorted(dict(m.headers())[DlqHeader.BATCH] for m in after) == [b"11", b"11", b"12"]
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 3
