"""Exactly-once export mechanics against a real Kafka-protocol broker and real Delta tables."""

from __future__ import annotations

import base64
import json
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from deltalake import DeltaTable, write_deltalake

from connectors.kafka.errors import KafkaUnavailable
from connectors.kafka.transactional_producer import (
    PositionRecord,
    TransactionalProducer,
    TransactionFatal,
)
from service.config.settings import settings_from_mapping
from service.delta_to_kafka.export_position import (
    ExportPosition,
    PositionError,
    PositionStore,
    restore_encoder_state,
)
from service.delta_to_kafka.formats import export_encoder
from service.delta_to_kafka.formats.export_encoder import ExportEncoder
from service.delta_to_kafka.pipeline import ExportPipeline
from service.operations.workload import create_topics
from tests.support.export_driver import consume, json_records


def _producer(bootstrap: str, unique: str, tid: str = "t") -> TransactionalProducer:
    return TransactionalProducer({"bootstrap.servers": bootstrap}, f"{tid}-{unique}", f"out-{unique}",
                                 f"positions-{unique}", timeout_s=30)


def _batch(start: int, count: int) -> list:
    return [(f"k{i}".encode(), f"v{i}".encode(), [("n", str(i).encode())]) for i in range(start, start + count)]


def _await_uncommitted(bootstrap: str, topic: str, key: bytes, timeout_s: float = 30.0) -> None:
    """Return once a read_uncommitted reader of partition 0 sees a record with `key`."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"await-{time.monotonic_ns()}",
                         "isolation.level": "read_uncommitted", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None and message.key() == key:
                return
            assert time.monotonic() < deadline, f"{key!r} not in {topic} within {timeout_s}s"
    finally:
        consumer.close()


def test_committed_batches_are_visible_exactly_once(kafka_bootstrap, unique):
    create_topics(kafka_bootstrap, [f"out-{unique}"], 1)
    producer = _producer(kafka_bootstrap, unique)
    try:
        assert producer.last_committed_position("exp") is None
        producer.send_batch(_batch(0, 10), PositionRecord("exp", b'{"version": 1}'))
        producer.send_batch([], PositionRecord("other", b'{"version": 7}'))
        producer.send_batch(_batch(10, 5), PositionRecord("exp", b'{"version": 3}'))
        assert producer.last_committed_position("exp") == b'{"version": 3}'
        assert producer.last_committed_position("other") == b'{"version": 7}'
    finally:
        producer.close()
    records = consume(kafka_bootstrap, f"out-{unique}")
    assert records == [(f"k{i}".encode(), f"v{i}".encode(), [("n", str(i).encode())]) for i in range(15)]


def test_a_full_local_queue_waits_and_loses_no_record(kafka_bootstrap, unique):
    create_topics(kafka_bootstrap, [f"out-{unique}"], 1)
    producer = TransactionalProducer({"bootstrap.servers": kafka_bootstrap, "queue.buffering.max.messages": 5},
                                     f"t-{unique}", f"out-{unique}", f"positions-{unique}", timeout_s=30)
    try:
        producer.send_batch(_batch(0, 400), PositionRecord("exp", b"1"))  # the queue fills many times over
    finally:
        producer.close()
    assert consume(kafka_bootstrap, f"out-{unique}") == _batch(0, 400)


def test_an_aborted_transaction_is_invisible(kafka_bootstrap, unique):
    create_topics(kafka_bootstrap, [f"out-{unique}"], 1)
    producer = _producer(kafka_bootstrap, unique)

    def failing_encoder():
        yield from _batch(100, 3)
        _await_uncommitted(kafka_bootstrap, f"out-{unique}", b"k102")  # the three reached the broker
        raise ValueError("encoder failed")

    try:
        producer.send_batch(_batch(0, 2), PositionRecord("exp", b"1"))
        with pytest.raises(ValueError, match="encoder failed"):
            producer.send_batch(failing_encoder(), PositionRecord("exp", b"2"))
        assert producer.last_committed_position("exp") == b"1"
        producer.send_batch(_batch(2, 2), PositionRecord("exp", b"3"))  # still usable after the abort
    finally:
        producer.close()
    uncommitted = [key for key, _, _ in consume(kafka_bootstrap, f"out-{unique}", "read_uncommitted")]
    assert uncommitted == [b"k0", b"k1", b"k100", b"k101", b"k102", b"k2", b"k3"]
    assert [key for key, _, _ in consume(kafka_bootstrap, f"out-{unique}")] == [b"k0", b"k1", b"k2", b"k3"]


def test_a_newer_instance_fences_the_older_one(kafka_bootstrap, unique):
    create_topics(kafka_bootstrap, [f"out-{unique}"], 1)
    old, new = _producer(kafka_bootstrap, unique), _producer(kafka_bootstrap, unique)
    try:
        old.send_batch(_batch(0, 2), PositionRecord("exp", b"1"))
        new.open()
        with pytest.raises(TransactionFatal, match="newer instance"):
            old.send_batch(_batch(50, 2), PositionRecord("exp", b"2"))
        new.send_batch(_batch(2, 1), PositionRecord("exp", b"3"))
        assert new.last_committed_position("exp") == b"3"
    finally:
        old.close()
        new.close()
    assert [key for key, _, _ in consume(kafka_bootstrap, f"out-{unique}")] == [b"k0", b"k1", b"k2"]


def test_a_position_committed_behind_another_writers_open_transaction_is_not_read_stale(kafka_bootstrap, unique):
    """Exports share one positions topic. Another writer's open transaction holds the last stable
    offset below a position committed after it began: a restarted export must not take the older
    position for its last one (it would publish that batch again); it waits, then reads the newest.
    Readers that only look may take the older one without waiting."""
    create_topics(kafka_bootstrap, [f"out-{unique}"], 1)
    first = _producer(kafka_bootstrap, unique)
    other = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"other-{unique}"})
    try:
        first.send_batch(_batch(0, 1), PositionRecord("exp", b"1"))
        other.init_transactions(30)
        other.begin_transaction()
        other.produce(f"positions-{unique}", key=b"other-export", value=b"7")
        assert other.flush(30) == 0
        first.send_batch(_batch(1, 1), PositionRecord("exp", b"2"))
    finally:
        first.close()
    blocked = TransactionalProducer({"bootstrap.servers": kafka_bootstrap}, f"t-{unique}", f"out-{unique}",
                                    f"positions-{unique}", timeout_s=10)
    try:
        # A reader that only looks (status, the retention check) does not wait: an older position.
        assert blocked.last_committed_position("exp", stable_only=True) == b"1"
        blocked.open()
        with pytest.raises(KafkaUnavailable, match="not readable to its end"):
            blocked.last_committed_position("exp")  # before the fix: b"1"
    finally:
        blocked.close()
    other.abort_transaction(30)
    restarted = _producer(kafka_bootstrap, unique)
    try:
        restarted.open()
        assert restarted.last_committed_position("exp") == b"2"
    finally:
        restarted.close()


def test_position_names_its_state_topic_in_a_record_of_bounded_size():
    position = ExportPosition("exp", "/tables/t", 42, "state-exp", 10**12)
    record = position.to_record()
    assert record.key == "exp" and len(record.value) < 120  # the size does not grow with the state
    assert ExportPosition.from_value("exp", record.value, "positions") == position
    stateless = ExportPosition("exp", "/tables/t", 7)
    assert ExportPosition.from_value("exp", stateless.to_record().value, "positions") == stateless
    # A position of the older format carried the whole state: it is read as a snapshot to migrate.
    legacy = b'{"export":"exp","table":"/tables/t","version":3,"state":"AHN0YXRl/w=="}'
    assert ExportPosition.from_value("exp", legacy, "positions").legacy_state == b"\x00state\xff"
    with pytest.raises(PositionError, match="topic=positions key=exp"):
        ExportPosition.from_value("exp", b'{"export":"exp","table":"t","version":1,"state":{"topic":1}}', "positions")


def _state_store(bootstrap: str, unique: str) -> PositionStore:
    producer = TransactionalProducer({"bootstrap.servers": bootstrap}, f"t-{unique}", f"out-{unique}",
                                     f"positions-{unique}", timeout_s=30, state_topic=f"state-{unique}")
    return PositionStore(producer, "exp", "/tables/t")


def test_state_records_commit_with_the_batch_and_are_checked_on_restore(kafka_bootstrap, unique):
    create_topics(kafka_bootstrap, [f"out-{unique}"], 1)
    store = _state_store(kafka_bootstrap, unique)
    try:
        assert store.committed() is None and store.committed_state(None) == {}
        store.publish(_batch(0, 1), 1, [(b"a", b"1"), (b"b", b"1"), (b"c", b"1")], state_entries=3)
        position = store.publish([], 2, [(b"a", b"2"), (b"b", None)], state_entries=2)
        with pytest.raises(ValueError, match="encoder failed"):
            store.producer.send_batch(_batch(1, 1), position.to_record(), _failing_state())
    finally:
        store.producer.close()
    again = _state_store(kafka_bootstrap, unique)
    try:
        committed = again.committed()
        assert committed == position and again.committed_state(committed) == {b"a": b"2", b"c": b"1"}
        # A state topic that lost records no longer matches its position: the restore refuses it.
        lost = ExportPosition("exp", "/tables/t", 2, f"state-{unique}", 3)
        with pytest.raises(PositionError, match=rf"topic=state-{unique}: holds 2 live state records.* with 3"):
            again.committed_state(lost)
        with pytest.raises(PositionError, match="no committed position with 0"):
            again.committed_state(None)
    finally:
        again.producer.close()


def _failing_state():
    yield b"c", None
    raise ValueError("encoder failed")


def test_a_legacy_position_snapshot_moves_to_the_state_topic(kafka_bootstrap, unique):
    create_topics(kafka_bootstrap, [f"out-{unique}"], 1)
    store = _state_store(kafka_bootstrap, unique)
    legacy = json.dumps({"export": "exp", "table": "/tables/t", "version": 4,
                         "state": base64.b64encode(b'{"1": 2, "5": 1}').decode()}).encode()
    try:
        store.producer.send_batch([], PositionRecord("exp", legacy))
        encoder = CountingEncoder()
        restore_encoder_state(store, store.committed(), encoder)
        assert encoder.counts == {1: 2, 5: 1}
        store.publish([], 5, encoder.state_changes(), encoder.state_entries())
        fresh = CountingEncoder()
        restore_encoder_state(store, store.committed(), fresh)
        assert fresh.counts == {1: 2, 5: 1} and store.committed().legacy_state is None
    finally:
        store.producer.close()


# --- the export pipeline: Spark + Delta + Kafka ---------------------------------------------------

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def _write_versions(path: str, first_id: int, versions: int) -> None:
    """Each version upserts two rows: a new id and an update of the previous version's new id."""
    for v in range(versions):
        new = first_id + v
        source = pa.table({"id": [new, new - 1], "name": [f"n{new}", f"u{new - 1}"]}, schema=SCHEMA)
        (DeltaTable(path).merge(source, "t.id = s.id", source_alias="s", target_alias="t")
         .when_matched_update_all().when_not_matched_insert_all().execute())


def _until_idle(pipeline: ExportPipeline) -> ExportPipeline:
    """Run the export until idle; it must end without an error."""
    query = pipeline.start(until_idle=True)
    try:
        query.awaitTermination(600)
    finally:
        pipeline.close()
    assert not query.isActive and query.exception() is None
    return pipeline


def _export(spark, path: str, workdir: Path, unique: str, bootstrap: str, starting_version: int = 0,
            max_rows: int | None = None) -> ExportPipeline:
    pipeline = ExportPipeline(
        spark, f"exp-{unique}", path, f"out-{unique}", {"bootstrap.servers": bootstrap}, str(workdir / "ck"),
        json_records, positions_topic=f"positions-{unique}", max_versions_per_trigger=2,
        starting_version=starting_version, max_rows_per_trigger=max_rows, key_columns=("id",),
    )
    return _until_idle(pipeline)


def _feed_keys(bootstrap: str, unique: str) -> list[tuple]:
    values = [json.loads(value) for _, value, _ in consume(bootstrap, f"out-{unique}")]
    return [(v["version"], v["change"], v["id"]) for v in values]


def _expected_keys(path: str) -> list[tuple]:
    feed = pa.table(DeltaTable(path).load_cdf(starting_version=0)).to_pylist()
    return sorted((r["_commit_version"], r["_change_type"], r["id"]) for r in feed)


# Versions of 3 feed rows (an insert, an update's -U/+U) in batches of at most 2 rows: every
# version is split after its update, so batches end inside versions and positions carry a row.
@pytest.mark.parametrize(("max_rows", "batches"), [(None, 3), (2, 9)], ids=["whole-versions", "row-chunks"])
def test_export_pipeline_publishes_once_across_replays_and_a_lost_checkpoint(
    spark, kafka_bootstrap, unique, workdir, max_rows, batches,
):
    create_topics(kafka_bootstrap, [f"out-{unique}"], 1)
    path = str(workdir / "t")
    DeltaTable.create(path, SCHEMA, configuration={"delta.enableChangeDataFeed": "true"})
    write_deltalake(path, pa.table({"id": [0], "name": ["n0"]}, schema=SCHEMA), mode="append")
    _write_versions(path, 1, 4)  # versions 0..5
    first = _export(spark, path, workdir, unique, kafka_bootstrap, max_rows=max_rows)
    published = _feed_keys(kafka_bootstrap, unique)
    assert sorted(published) == _expected_keys(path) and len(published) == 1 + 4 * 3
    assert [v for v, _, _ in published] == sorted(v for v, _, _ in published)
    assert first.committed_batches == batches and first.position.version == 5
    assert first.batches_read_ahead == batches  # each batch's rows read while Spark started or the batch before published

    # A crash after the Kafka commit, before Spark's: the batch is replayed, found in Kafka, skipped.
    commits = workdir / "ck" / "commits"
    last_batch = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last_batch)).unlink()
    (commits / f".{last_batch}.crc").unlink()  # the local file system's checksum of that file
    replay = _export(spark, path, workdir, unique, kafka_bootstrap, max_rows=max_rows)
    assert (replay.skipped_batches, replay.committed_batches) == (1, 0)
    assert _feed_keys(kafka_bootstrap, unique) == published

    # New versions, and the checkpoint lost: versions already in Kafka are not published again.
    _write_versions(path, 5, 3)  # versions 6..8
    shutil.rmtree(workdir / "ck")
    again = _export(spark, path, workdir, unique, kafka_bootstrap, starting_version=0, max_rows=max_rows)
    assert again.position.version == 8
    final = _feed_keys(kafka_bootstrap, unique)
    assert sorted(final) == _expected_keys(path) and len(final) == len(set(final)) == 13 + 3 * 3
    assert final[: len(published)] == published


def test_records_encoded_ahead_equal_those_encoded_in_the_batch(spark, kafka_bootstrap, unique, workdir, monkeypatch):
    """The same table exported twice by the same batches: with the stateless `ExportEncoder` (each batch's
    first runs encoded while the batch before committed) and through a plain function (never ahead)."""
    monkeypatch.setattr(export_encoder, "SLICE_CHANGES", 2)  # several runs a batch, more than are encoded ahead
    path = str(workdir / "t")
    DeltaTable.create(path, SCHEMA, configuration={"delta.enableChangeDataFeed": "true"})
    write_deltalake(path, pa.table({"id": list(range(12)), "name": [f"n{i}" for i in range(12)]}, schema=SCHEMA),
                    mode="append")
    _write_versions(path, 12, 4)
    DeltaTable(path).delete("id < 3")
    settings = settings_from_mapping({"exports": [{"name": "e", "table": "t", "topic": "t", "primary_key": "id",
                                                   "preset": "debezium"}]}).exports[0]
    published = {}
    for how in ("ahead", "in-batch"):
        create_topics(kafka_bootstrap, [f"out-{how}-{unique}"], 1)
        pipeline = _export_encoded(spark, path, workdir, unique, kafka_bootstrap, settings, how)
        published[how] = (_without_processing_time(consume(kafka_bootstrap, f"out-{how}-{unique}")),
                          pipeline.committed_batches, pipeline.batches_encoded_ahead)
    records, batches, ahead = published["ahead"]
    # 12 inserts; 4 versions of an insert and an update; 3 deletes, each with its tombstone
    assert (records, batches) == published["in-batch"][:2] and len(records) == 12 + 4 * 2 + 3 * 2 and batches >= 5
    assert published["in-batch"][2] == 0
    # The first batch is encoded while Spark starts the query (seconds); the others when the
    # commit before left time, which a loaded machine may not.
    assert ahead >= 1

    # The checkpoint lost: the first batch, encoded ahead while Spark starts, lies below the committed
    # position and is not used; only the new versions are published, as they are without encoding ahead.
    _write_versions(path, 16, 2)
    for how in ("ahead", "in-batch"):
        shutil.rmtree(workdir / f"ck-{how}")
        _export_encoded(spark, path, workdir, unique, kafka_bootstrap, settings, how)
        published[how] = _without_processing_time(consume(kafka_bootstrap, f"out-{how}-{unique}"))
    assert published["ahead"] == published["in-batch"] and len(published["ahead"]) == len(records) + 2 * 2


def _export_encoded(spark, path: str, workdir: Path, unique: str, bootstrap: str, settings, how: str) -> ExportPipeline:
    """Export until idle with an `ExportEncoder`: as it is (`ahead`) or behind a plain function (`in-batch`)."""
    encoder = ExportEncoder(settings)
    pipeline = ExportPipeline(
        spark, f"exp-{how}-{unique}", path, f"out-{how}-{unique}", {"bootstrap.servers": bootstrap},
        str(workdir / f"ck-{how}"), encoder if how == "ahead" else (lambda feed: encoder(feed)),
        positions_topic=f"positions-{unique}", max_versions_per_trigger=1, max_rows_per_trigger=10,
        key_columns=("id",),
    )
    return _until_idle(pipeline)


def _without_processing_time(records: list[tuple]) -> list[tuple]:
    """(key, value, headers) with each envelope's `ts_ms` (when the record was encoded) left out."""
    kept = []
    for key, value, headers in records:
        envelope = None if value is None else json.loads(value)
        if envelope is not None:
            envelope.pop("ts_ms")
        kept.append((key, envelope, headers))
    return kept


class CountingEncoder:
    """Numbers each key's records 1, 2, 3...; the counts are state carried from flush to flush."""

    def __init__(self, fail_once_at_version: int | None = None) -> None:
        self.counts: dict[int, int] = {}
        self.changed: set[int] = set()
        self.fail_at = fail_once_at_version

    def __call__(self, feed: pa.Table) -> list:
        records = []
        for row in feed.to_pylist():
            if row["_commit_version"] == self.fail_at:
                self.fail_at = None
                raise RuntimeError("encoder failed half-way through a flush")
            key = row["id"]
            self.counts[key] = self.counts.get(key, 0) + 1
            self.changed.add(key)
            records.append((str(key).encode(), json.dumps({"n": self.counts[key]}).encode(), None))
        return records

    def state_changes(self) -> list:
        changes = [(str(key).encode(), str(self.counts[key]).encode()) for key in sorted(self.changed)]
        self.changed = set()
        return changes

    def state_entries(self) -> int:
        return len(self.counts)

    def restore_state(self, records: dict) -> None:
        self.counts, self.changed = {int(k): int(v) for k, v in records.items()}, set()

    def restore(self, snapshot: bytes | None) -> None:
        self.counts = {int(k): v for k, v in json.loads(snapshot).items()} if snapshot else {}
        self.changed = set(self.counts)


def test_encoder_state_follows_the_committed_position(spark, kafka_bootstrap, unique, workdir):
    create_topics(kafka_bootstrap, [f"out-{unique}"], 1)
    path = str(workdir / "t")
    DeltaTable.create(path, SCHEMA, configuration={"delta.enableChangeDataFeed": "true"})
    write_deltalake(path, pa.table({"id": [0], "name": ["n0"]}, schema=SCHEMA), mode="append")
    _write_versions(path, 1, 4)  # versions 0..5; batches [0, 1], [2, 3], [4, 5]

    def run(encoder: CountingEncoder) -> ExportPipeline:
        pipeline = ExportPipeline(
            spark, f"exp-{unique}", path, f"out-{unique}", {"bootstrap.servers": kafka_bootstrap},
            str(workdir / "ck"), encoder, positions_topic=f"positions-{unique}", max_versions_per_trigger=2,
            encoder_state=encoder,
        )
        query = pipeline.start(until_idle=True)
        try:
            query.awaitTermination(600)
        except Exception:  # noqa: BLE001 - the failed run is checked through the pipeline
            pass
        finally:
            pipeline.close()
        return pipeline

    encoder = CountingEncoder(fail_once_at_version=5)
    failed = run(encoder)
    assert isinstance(failed.failure, RuntimeError) and failed.committed_batches == 2
    assert encoder.counts[3] == 1  # id 3's insert (version 4) counted in memory, never committed
    run(encoder)  # the same process restarts the export: the state is restored first
    _write_versions(path, 5, 2)  # versions 6, 7
    run(CountingEncoder())  # a new process: the state comes from the committed position
    numbers: dict[bytes, list[int]] = {}
    for key, value, _ in consume(kafka_bootstrap, f"out-{unique}"):
        numbers.setdefault(key, []).append(json.loads(value)["n"])
    assert numbers and all(ns == list(range(1, len(ns) + 1)) for ns in numbers.values())
    assert sum(len(ns) for ns in numbers.values()) == 1 + 6 * 3
