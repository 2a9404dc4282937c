"""The consumers the range readers open, against Apache Kafka: the settings they read with.

A reader decodes between its reads, so librdkafka's prefetch queue fills up and the partition's next
fetch is put off by `fetch.queue.backoff.ms` (librdkafka's default: a second, which a steady batch spent
waiting in `consume()`); and the prefetch past a range's end, once at the log end, is held by the broker for
`fetch.wait.max.ms`, which holds the consumer's next range. Every consumer the readers open gets the short
backoff and wait unless the pipeline's Kafka options set them; the records read are the range's either way.

A process keeps its readers' consumers connected between reads (`range_reader.IDLE_CONSUMERS`): the
next read, of any range, takes the last one's consumer, and a read that failed or was left unfinished
gives its consumer up.
"""

from __future__ import annotations

import gc
import os
import signal
import time
import uuid
import weakref

import pytest
from confluent_kafka import Consumer, Producer

from connectors.kafka import range_reader
from connectors.kafka.range_reader import (
    FETCH_QUEUE_BACKOFF_MS,
    FETCH_WAIT_MAX_MS,
    read_values,
    read_values_of_ranges,
)
from service.operations.workload import create_topics


@pytest.fixture
def topic(kafka_bootstrap: str) -> str:
    name = f"range-consumers-{uuid.uuid4().hex[:10]}"
    create_topics(kafka_bootstrap, [name], 2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(400):
        producer.produce(name, value=b"v%d" % i, partition=i % 2)
    assert producer.flush(30) == 0
    return name


@pytest.fixture
def opened(monkeypatch) -> list[dict]:
    """The configuration of every consumer the readers open from now on."""
    configs: list[dict] = []
    range_reader.IDLE_CONSUMERS.close()  # none left over from an earlier test

    def recording(config: dict) -> Consumer:
        configs.append(dict(config))
        return Consumer(config)

    monkeypatch.setattr(range_reader, "Consumer", recording)
    return configs


@pytest.mark.parametrize("options", [{}, {"fetch.queue.backoff.ms": "250", "fetch.wait.max.ms": "300"}],
                         ids=["default", "pipeline-option"])
def test_every_reader_consumer_fetches_again_soon_once_its_queue_is_full(kafka_bootstrap: str, topic: str,
                                                                         opened: list[dict], options: dict):
    settings = {"bootstrap.servers": kafka_bootstrap, **options}
    values = [v for chunk in read_values(settings, topic, 0, 10, 150) for v in chunk.values]
    assert values == [b"v%d" % i for i in range(20, 300, 2)]
    ranges = read_values_of_ranges(settings, [(topic, 0, 0, 200), (topic, 1, 0, 200)])
    assert [len(v) for chunks in ranges.values() for chunk in chunks for v in [chunk.values]] == [200, 200]
    want = options.get("fetch.queue.backoff.ms", str(FETCH_QUEUE_BACKOFF_MS))
    assert len(opened) == 1 and opened[0]["fetch.queue.backoff.ms"] == want  # the second read reused the first's
    assert int(FETCH_QUEUE_BACKOFF_MS) < 100  # librdkafka's default is 1,000
    # nor does the broker hold its fetches at the log end (which would hold its next range's first fetch)
    assert opened[0]["fetch.wait.max.ms"] == options.get("fetch.wait.max.ms", str(FETCH_WAIT_MAX_MS))
    assert int(FETCH_WAIT_MAX_MS) < 100  # librdkafka's default is 500


def test_a_kept_consumer_reads_each_range_exactly(kafka_bootstrap: str, topic: str, opened: list[dict], monkeypatch):
    monkeypatch.setattr(range_reader, "_STALL_TIMEOUT_S", 15.0)  # a read that waits forever fails sooner
    settings = {"bootstrap.servers": kafka_bootstrap}
    reads = [(0, 100, 180), (1, 0, 40), (0, 10, 20), (1, 150, 200), (0, 0, 200), (1, 199, 200), (0, 50, 50)]
    for partition, start, end in reads:  # partitions switched, offsets going back, an empty range
        values = [v for chunk in read_values(settings, topic, partition, start, end) for v in chunk.values]
        assert values == [b"v%d" % (2 * offset + partition) for offset in range(start, end)], (partition, start, end)
    ranges = read_values_of_ranges(settings, [(topic, 0, 190, 200), (topic, 1, 5, 7)])
    assert [v for chunk in ranges[(topic, 0, 190, 200)] for v in chunk.values] == [b"v%d" % (2 * o) for o in range(190, 200)]
    assert [v for chunk in ranges[(topic, 1, 5, 7)] for v in chunk.values] == [b"v11", b"v13"]
    for partition in (0, 1):  # paused where their ranges ended above: a kept consumer must fetch them again
        values = [v for chunk in read_values(settings, topic, partition, 20, 30) for v in chunk.values]
        assert values == [b"v%d" % (2 * offset + partition) for offset in range(20, 30)]
    assert len(opened) == 1


def test_an_unfinished_read_gives_its_consumer_up(kafka_bootstrap: str, topic: str, opened: list[dict], monkeypatch):
    monkeypatch.setattr(range_reader, "BATCH_ROWS", 50)
    settings = {"bootstrap.servers": kafka_bootstrap}
    reader = read_values(settings, topic, 0, 0, 200)
    assert len(next(reader).values) == 50  # the range's first chunk, then the reader is dropped
    reader.close()
    values = [v for chunk in read_values(settings, topic, 0, 0, 200) for v in chunk.values]
    assert values == [b"v%d" % (2 * offset) for offset in range(200)]
    assert len(opened) == 2


def test_a_forked_child_does_not_take_its_parents_consumers(kafka_bootstrap: str, topic: str, opened: list[dict]):
    """A read in a forked child through its parent's consumer hangs (that consumer's threads stayed in the
    parent), so the child starts with no kept consumers. The child only looks at them here: opening a
    consumer in a child forked while the parent's librdkafka threads run is not fork-safe (POSIX allows only
    async-signal-safe calls until exec; one clean-clone CI run saw such a child hang inside librdkafka), and
    the service never forks a process that reads (Spark forks its Python workers from a daemon that reads
    nothing). That a child's next read opens a consumer of its own is the next test's."""
    settings = {"bootstrap.servers": kafka_bootstrap}
    assert len([v for chunk in read_values(settings, topic, 0, 0, 10) for v in chunk.values]) == 10  # one kept
    assert [len(idle) for idle in range_reader.IDLE_CONSUMERS._idle.values()] == [1]
    child = os.fork()
    if child == 0:
        try:
            os._exit(0 if range_reader.IDLE_CONSUMERS._idle == {} else 1)
        finally:
            os._exit(2)
    deadline = time.monotonic() + 90
    while (done := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    if done[0] == 0:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        pytest.fail("the forked child did not exit")
    assert os.waitstatus_to_exitcode(done[1]) == 0, "the forked child kept its parent's consumers"
    values = [v for chunk in read_values(settings, topic, 1, 0, 10) for v in chunk.values]
    assert values == [b"v%d" % (2 * o + 1) for o in range(10)]
    assert len(opened) == 1  # the parent still has its own


def test_a_forked_childs_inherited_consumers_are_never_destroyed_nor_taken(monkeypatch):
    """Destroying a parent's consumer in a forked child aborted the child (librdkafka works through the
    parent's threads), and reading through one hangs: after `forget` (run in every forked child) the pool
    keeps each alive and opens a new consumer for the next read. Objects stand in for the consumers: only
    whether anything still holds one, and which one a read gets, matter."""

    class Kept:
        pass

    pool = range_reader._IdleConsumers()
    inherited = Kept()
    pool._idle[(("group.id", "g"),)] = [inherited]
    alive = weakref.ref(inherited)
    pool.forget()
    del inherited
    gc.collect()
    assert alive() is not None, "a consumer of the parent's was deallocated in the child"
    assert pool._idle == {}
    opened: list[dict] = []
    monkeypatch.setattr(range_reader, "Consumer", lambda config: opened.append(config) or Kept())
    taken = pool.take({"group.id": "g"})
    assert opened == [{"group.id": "g"}] and taken is not alive()


def test_a_chunks_first_key_is_its_first_key_not_null(kafka_bootstrap: str):
    """Records taken a whole `consume()` at a time keep `add`'s rule: an empty key is a key, a null one is not."""
    name = f"range-first-key-{uuid.uuid4().hex[:10]}"
    create_topics(kafka_bootstrap, [name], 1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for key in (None, None, b"", b"k"):
        producer.produce(name, key=key, value=b"v", partition=0)
    assert producer.flush(30) == 0
    chunks = list(read_values({"bootstrap.servers": kafka_bootstrap}, name, 0, 0, 4))
    assert [chunk.first_key for chunk in chunks][:1] == [b""]
    assert [v for chunk in chunks for v in chunk.values] == [b"v"] * 4
