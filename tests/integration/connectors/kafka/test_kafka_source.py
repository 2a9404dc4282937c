"""The Kafka streaming source against a real Kafka-protocol broker, read through Spark."""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from connectors.kafka.cluster import ClusterView
from connectors.kafka.range_reader import ValueChunk, read_range, read_values, read_values_of_ranges
from connectors.kafka.source import FORMAT_NAME, KafkaSource
from service.operations.workload import create_topics


def _produce(bootstrap: str, topic: str, partitions: int, count: int, start: int = 0) -> None:
    """`count` records dealt over `partitions`, each delivered (a record for a partition the producer's
    metadata does not show yet fails its delivery, which `flush` alone does not tell)."""
    producer = Producer({"bootstrap.servers": bootstrap})
    failed: list[str] = []

    def delivered(error, message) -> None:
        if error is not None:
            failed.append(f"partition {message.partition()}: {error}")

    for i in range(start, start + count):
        producer.produce(topic, key=f"k{i}", value=json.dumps({"i": i}), partition=i % partitions,
                         headers=[("trace", f"t{i}".encode())], on_delivery=delivered)
    assert producer.flush(30) == 0
    assert failed == []


def _collect(spark, bootstrap, topics, checkpoint, **options):
    """Run the source once with Trigger.AvailableNow; return [(batch_id, rows)]."""
    spark.dataSource.register(KafkaSource)
    reader = spark.readStream.format(FORMAT_NAME).option("bootstrap.servers", bootstrap)
    reader = reader.option("topics", ",".join(topics))
    for key, value in options.items():
        reader = reader.option(key, value)
    batches = []
    query = (
        reader.load().writeStream.foreachBatch(lambda df, bid: batches.append((bid, df.collect())))
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    )
    query.awaitTermination(300)
    assert not query.isActive
    return batches


def test_reads_every_record_with_coordinates(spark, kafka_bootstrap, unique, workdir):
    topics = [f"src-a-{unique}", f"src-b-{unique}"]
    create_topics(kafka_bootstrap, topics, 3)
    for topic in topics:
        _produce(kafka_bootstrap, topic, 3, 300)
    rows = [r for _, batch in _collect(spark, kafka_bootstrap, topics, workdir / "ck") for r in batch]
    assert len(rows) == 600
    seen = {(r.topic, r.partition, r.offset) for r in rows}
    assert len(seen) == 600
    for topic in topics:
        for partition in range(3):
            offsets = sorted(r.offset for r in rows if r.topic == topic and r.partition == partition)
            assert offsets == list(range(100))
    sample = next(r for r in rows if r.topic == topics[0] and r.partition == 1 and r.offset == 0)
    assert sample.key == b"k1" and json.loads(sample.value) == {"i": 1}
    assert [(h.key, h.value) for h in sample.headers] == [("trace", b"t1")]
    assert sample.timestamp is not None


def test_resumes_from_checkpoint_and_picks_up_new_partitions(spark, kafka_bootstrap, unique, workdir):
    topic = f"src-grow-{unique}"
    create_topics(kafka_bootstrap, [topic], 2)
    _produce(kafka_bootstrap, topic, 2, 40)
    first = _collect(spark, kafka_bootstrap, [topic], workdir / "ck")
    assert sum(len(b) for _, b in first) == 40
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.create_partitions([NewPartitions(topic, 4)]).values():
        future.result(30)
    deadline = time.monotonic() + 60  # the broker's metadata shows the new partitions (applied after the call)
    while len(admin.list_topics(topic, timeout=10).topics[topic].partitions) < 4:
        assert time.monotonic() < deadline, "the new partitions never showed in the metadata"
        time.sleep(0.1)
    _produce(kafka_bootstrap, topic, 4, 40, start=1000)
    second = _collect(spark, kafka_bootstrap, [topic], workdir / "ck")
    rows = [r for _, b in second for r in b]
    assert sorted(json.loads(r.value)["i"] for r in rows) == list(range(1000, 1040))
    assert {r.partition for r in rows} == {0, 1, 2, 3}


def test_admission_control_caps_each_batch(spark, kafka_bootstrap, unique, workdir):
    topic = f"src-cap-{unique}"
    create_topics(kafka_bootstrap, [topic], 4)
    _produce(kafka_bootstrap, topic, 4, 1000)
    batches = _collect(spark, kafka_bootstrap, [topic], workdir / "ck", maxOffsetsPerTrigger="300")
    sizes = [len(rows) for _, rows in batches if rows]
    assert sum(sizes) == 1000
    assert max(sizes) <= 300 and len(sizes) >= 4


def test_min_partitions_reads_a_lone_range_in_pieces(spark, kafka_bootstrap, unique, workdir):
    topic = f"src-pieces-{unique}"
    create_topics(kafka_bootstrap, [topic], 1)
    _produce(kafka_bootstrap, topic, 1, 900)
    spark.dataSource.register(KafkaSource)
    frame = (spark.readStream.format(FORMAT_NAME).option("bootstrap.servers", kafka_bootstrap).option("topics", topic)
             .option("minPartitions", "3").option("minPartitionRows", "100").load())
    pieces = []

    def collect(df, _):
        pieces.extend(tuple(sorted(r.offset for r in part)) for part in df.rdd.glom().collect())

    query = (frame.writeStream.foreachBatch(collect).option("checkpointLocation", str(workdir / "ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert not query.isActive
    assert [(p[0], p[-1], len(p)) for p in pieces] == [(0, 224, 225), (225, 449, 225), (450, 899, 450)]


@pytest.mark.parametrize("starting", ["latest", "explicit"])
def test_starting_offsets(spark, kafka_bootstrap, unique, workdir, starting):
    topic = f"src-start-{starting}-{unique}"
    create_topics(kafka_bootstrap, [topic], 1)
    _produce(kafka_bootstrap, topic, 1, 10)
    option = "latest" if starting == "latest" else json.dumps({topic: {"0": 7}})
    rows = [r for _, b in _collect(spark, kafka_bootstrap, [topic], workdir / "ck", startingOffsets=option) for r in b]
    assert sorted(r.offset for r in rows) == ([] if starting == "latest" else [7, 8, 9])


def test_read_values_gives_the_values_offsets_and_timestamps_read_range_gives(kafka_bootstrap, unique):
    topic = f"src-values-{unique}"
    create_topics(kafka_bootstrap, [topic], 2)
    _produce(kafka_bootstrap, topic, 2, 12_040)  # 6,020 per partition: more than one chunk
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic, key=b"gone", value=None, partition=1)  # a tombstone
    assert producer.flush(30) == 0
    options = {"bootstrap.servers": kafka_bootstrap}
    for partition, (start, end) in ((0, (0, 6_020)), (1, (17, 6_021))):
        batches = list(read_range(options, topic, partition, start, end))
        chunks = list(read_values(options, topic, partition, start, end))
        assert len(chunks) >= 2
        values = [v for chunk in chunks for v in chunk.values]
        assert values == [v for batch in batches for v in batch.column("value").to_pylist()]
        assert [o for chunk in chunks for o in chunk.offsets] == list(range(start, end))
        expected = [ValueChunk.of_batch(batch) for batch in batches]
        assert [t for chunk in chunks for t in chunk.timestamps] == [t for c in expected for t in c.timestamps]
        assert {(chunk.topic, chunk.partition) for chunk in chunks} == {(topic, partition)}
        assert all(isinstance(t, int) and t > 1_700_000_000_000 for chunk in chunks for t in chunk.timestamps)
    assert values[-1] is None and json.loads(values[0]) == {"i": 35}


def test_chunks_that_keep_their_records_give_the_batches_read_range_gives(kafka_bootstrap, unique):
    topic = f"src-kept-{unique}"
    create_topics(kafka_bootstrap, [topic], 1)
    _produce(kafka_bootstrap, topic, 1, 6_010)  # more than one chunk; every record with a header
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic, key=b"gone", value=None)  # a tombstone, without headers
    assert producer.flush(30) == 0
    options = {"bootstrap.servers": kafka_bootstrap}
    expected = pa.Table.from_batches(list(read_range(options, topic, 0, 3, 6_011, 1_234)))
    chunks = list(read_values(options, topic, 0, 3, 6_011, keep_records=True, floor=1_234))
    assert len(chunks) >= 2 and all(chunk.floor == 1_234 for chunk in chunks)
    assert pa.Table.from_batches([chunk.records() for chunk in chunks]).equals(expected)
    some = [0, 7, len(chunks[1].offsets) - 1]  # the records at some positions of a chunk, in their order
    picked = chunks[1].records(some)
    assert picked.column("offset").to_pylist() == [chunks[1].offsets[p] for p in some]
    assert picked.to_pylist() == [row for row in expected.to_pylist() if row["offset"] in picked.column("offset").to_pylist()]
    with pytest.raises(ValueError, match="keep_records"):
        next(read_values(options, topic, 0, 3, 10)).records()


def test_one_consumer_reads_many_ranges_as_a_consumer_per_range_does(kafka_bootstrap, unique):
    plain, txn = f"src-many-{unique}", f"src-many-txn-{unique}"
    create_topics(kafka_bootstrap, [plain, txn], 2)
    _produce(kafka_bootstrap, plain, 2, 14_000)  # 7,000 per partition: more than one chunk
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"many-{unique}"})
    producer.init_transactions()
    for commit, values in ((True, range(0, 5)), (False, range(5, 9)), (True, range(9, 12))):
        producer.begin_transaction()
        for i in values:
            producer.produce(txn, key=f"k{i}", value=json.dumps({"i": i}), partition=0)
        producer.commit_transaction() if commit else producer.abort_transaction()
    options = {"bootstrap.servers": kafka_bootstrap}
    cluster = ClusterView(options)
    try:  # the last stable offset: past the first two transactions' markers once the broker has them
        deadline = time.monotonic() + 60
        while cluster.watermarks([(txn, 0)])[(txn, 0)][1] < 10 and time.monotonic() < deadline:
            time.sleep(0.1)
        consumer_end = cluster.watermarks([(txn, 0)])[(txn, 0)][1]
    finally:
        cluster.close()
    assert consumer_end >= 10  # 5 records, a marker, 4 aborted records: the range ends among markers
    ranges = [(plain, 0, 0, 7_000), (plain, 1, 17, 3_000), (plain, 1, 3_000, 6_990), (txn, 0, 0, consumer_end),
              (txn, 1, 0, 0)]
    found = read_values_of_ranges(options, ranges)
    assert set(found) == set(ranges)
    for kafka_range in ranges:
        expected = list(read_values(options, *kafka_range))
        got = found[kafka_range]
        assert [v for c in got for v in c.values] == [v for c in expected for v in c.values], kafka_range
        assert [o for c in got for o in c.offsets] == [o for c in expected for o in c.offsets]
        assert [t for c in got for t in c.timestamps] == [t for c in expected for t in c.timestamps]
        assert [c.first_key for c in got[:1]] == [c.first_key for c in expected[:1]]
        assert {(c.topic, c.partition) for c in got} <= {kafka_range[:2]}
    assert [o for c in found[(plain, 1, 17, 3_000)] for o in c.offsets] == list(range(17, 3_000))
    assert [json.loads(v)["i"] for c in found[(txn, 0, 0, consumer_end)] for v in c.values] [:5] == list(range(5))
    assert found[(txn, 1, 0, 0)] == []
