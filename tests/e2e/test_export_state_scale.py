"""An upsert-input export of a 200,000-key table: the encoder keeps an image of every key.

That state goes to the export's compacted state topic, one record per key, in the batches'
transactions; the position record stays a few hundred bytes. A restart (a new encoder, as in
a new process) reads the state back and continues: the topic then holds exactly what one run
over all versions produces, and the restored state equals that run's state.
"""

from __future__ import annotations

from collections import defaultdict

import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable, write_deltalake

from connectors.delta.change_feed import feed_schema, read_versions
from connectors.kafka.transactional_producer import TransactionalProducer
from service.config.exports import ExportSettings
from service.delta_to_kafka.export_position import PositionStore, restore_encoder_state
from service.delta_to_kafka.formats.export_encoder import ExportEncoder
from service.delta_to_kafka.formats.output_formats import Header
from service.delta_to_kafka.pipeline import ExportPipeline
from service.operations.workload import create_topics
from tests.support.export_driver import consume

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

KEYS = 200_000
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
SOURCE_SCHEMA = pa.schema([*SCHEMA, ("gone", pa.bool_())])
NOW = 1_700_000_000.0  # the encoders' clock: the envelopes' ts_ms are equal in every run
POSITION_LIMIT_BYTES = 256


def _merge(path: str, updates: list[range], deletes: list[range], tag: str) -> None:
    """One commit: the `updates` ids upserted (named `tag` + id), the `deletes` ids deleted."""
    upserted = [i for ids in updates for i in ids]
    deleted = [i for ids in deletes for i in ids]
    source = pa.table({"id": upserted + deleted, "name": [f"{tag}{i}" for i in upserted + deleted],
                       "gone": [False] * len(upserted) + [True] * len(deleted)}, schema=SOURCE_SCHEMA)
    (DeltaTable(path).merge(source, "t.id = s.id", source_alias="s", target_alias="t")
     .when_matched_delete(predicate="s.gone")
     .when_matched_update(updates={"name": "s.name"}, predicate="NOT s.gone")
     .when_not_matched_insert(updates={"id": "s.id", "name": "s.name"}, predicate="NOT s.gone")
     .execute())


def _settings(unique: str) -> ExportSettings:
    return ExportSettings(name=f"scale-{unique}", table="t", topic=f"scale-out-{unique}", primary_key="id",
                          preset="debezium", input_changelog="upsert")


def _run(spark, settings: ExportSettings, path: str, checkpoint: str, bootstrap: str) -> ExportPipeline:
    """One export run until idle with a fresh encoder, as a new process would start it."""
    encoder = ExportEncoder(settings, clock=lambda: NOW)
    pipeline = ExportPipeline(
        spark, settings.name, path, settings.topic, {"bootstrap.servers": bootstrap}, checkpoint, encoder,
        positions_topic=f"scale-positions-{settings.name}", max_versions_per_trigger=1, encoder_state=encoder,
    )
    query = pipeline.start(until_idle=True)
    try:
        query.awaitTermination(900)
    finally:
        pipeline.close()
    assert not query.isActive and query.exception() is None and pipeline.failure is None
    return pipeline


def _by_version(records: list[tuple]) -> dict[int, list[tuple]]:
    """(key, value) per commit version, sorted: delta-rs lists the rows of one commit in no fixed order."""
    versions: dict[int, list[tuple]] = defaultdict(list)
    for key, value, headers in records:
        versions[int(dict(headers)[Header.COMMIT_VERSION])].append((key, value))
    return {version: sorted(pairs, key=repr) for version, pairs in versions.items()}


def _delete_topics(bootstrap: str, topics: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(topics, operation_timeout=60).values():
        future.result(60)


def test_a_200k_key_upsert_export_keeps_a_small_position_and_restarts_as_one_run(
    spark, kafka_bootstrap, unique, workdir,
):
    settings, path, checkpoint = _settings(unique), str(workdir / "t"), str(workdir / "ck")
    DeltaTable.create(path, SCHEMA, configuration={"delta.enableChangeDataFeed": "true"})  # v0
    write_deltalake(path, pa.table({"id": range(KEYS), "name": [f"n{i}" for i in range(KEYS)]}, schema=SCHEMA),
                    mode="append")  # v1: 200,000 keys
    _merge(path, [range(0, 1000)], [range(1000, 1500)], "u")  # v2
    create_topics(kafka_bootstrap, [settings.topic], 1)
    first = _run(spark, settings, path, checkpoint, kafka_bootstrap)
    store = PositionStore(TransactionalProducer(
        {"bootstrap.servers": kafka_bootstrap}, f"reader-{unique}", settings.topic, first.positions_topic,
        state_topic=first.state_topic), settings.name, path)
    try:
        raw = store.producer.last_committed_position(settings.name)
        assert first.position.version == 2 and first.position.state_entries == KEYS - 500
        assert len(raw) < POSITION_LIMIT_BYTES, raw

        # The process stops after the last Kafka commit, before Spark's: that batch is replayed and skipped.
        commits = workdir / "ck" / "commits"
        last_batch = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
        (commits / str(last_batch)).unlink()
        (commits / f".{last_batch}.crc").unlink()  # the local file system's checksum of that file
        # v3: updates (500 of them to keys the state holds), 500 keys back, 250 new keys, 100 deletes
        _merge(path, [range(500, 1500), range(KEYS - 250, KEYS + 250)], [range(0, 100)], "w")
        _merge(path, [range(100, 200)], [range(KEYS, KEYS + 50)], "x")  # v4
        second = _run(spark, settings, path, checkpoint, kafka_bootstrap)
        assert (second.skipped_batches, second.committed_batches, second.position.version) == (1, 2, 4)
        assert len(store.producer.last_committed_position(settings.name)) < POSITION_LIMIT_BYTES

        # One run over every version, one version per flush as the pipeline's batches.
        single = ExportEncoder(settings, clock=lambda: NOW)
        schema = feed_schema(pa.schema(DeltaTable(path).schema().to_arrow()))
        expected = [kafka for v in range(5) for kafka in single(read_versions(path, None, v, v, schema))]
        published = consume(kafka_bootstrap, settings.topic)
        assert len(published) == len(expected) and _by_version(published) == _by_version(expected)
        versions = [int(dict(headers)[Header.COMMIT_VERSION]) for _, _, headers in published]
        assert versions == sorted(versions)
        assert len({(key, value, v) for (key, value, _), v in zip(published, versions)}) == len(published)

        restored = ExportEncoder(settings)
        restore_encoder_state(store, store.committed(), restored)
        alive = KEYS + 250 - 100 - 50
        for state in (second.encode.changelog.state, restored.changelog.state):
            assert len(state) == len(single.changelog.state) == alive
            assert all(state.previous((i,), NOW) == single.changelog.state.previous((i,), NOW)
                       for i in range(KEYS + 250))
    finally:
        store.producer.close()
        _delete_topics(kafka_bootstrap, [settings.topic, first.state_topic, first.positions_topic])
