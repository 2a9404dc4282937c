"""Python workers' heaps frozen at each task's start (`worker_heap`), and the task entry points that do it.

Spark's daemon collects garbage after every task of a reused worker; what was frozen is not walked. The
entry points are called here in this process, as a Spark worker calls them; the stateful processors'
`init` gets a stand-in for Spark's state handle (a `MagicMock`: only that `init` runs matters here)."""

from __future__ import annotations

import gc
import pickle
from unittest.mock import MagicMock

import pytest

from service.kafka_to_delta.changelog.stage import OrderAndUnzipProcessor
from service.kafka_to_delta.materialize.bucket_stage import BucketProcessor
from service.kafka_to_delta.materialize.bulk import StageConfig
from service.kafka_to_delta.materialize.key_stage import MaterializerProcessor
from service.kafka_to_delta.materialize.payload import NetPayload
from service.kafka_to_delta.materialize.rules import MaterializerConfig
from service.kafka_to_delta.source.changes_source import ChangesStreamReader
from service.runtime import worker_heap


@pytest.fixture(autouse=True)
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_task_start_freezes_the_heap_and_one_in_full_every_leaves_it_whole(monkeypatch):
    monkeypatch.setattr(worker_heap, "_started", 0)
    whole = []
    for task in range(1, 2 * worker_heap.FULL_EVERY + 1):
        worker_heap.task_started()
        if gc.get_freeze_count() == 0:
            whole.append(task)
    assert whole == [worker_heap.FULL_EVERY, 2 * worker_heap.FULL_EVERY]


def test_the_collection_after_a_task_walks_only_what_the_task_made(monkeypatch):
    monkeypatch.setattr(worker_heap, "_started", 0)
    held = [[n] for n in range(50_000)]  # what a worker keeps between tasks (its imports, its caches)
    assert len(gc.get_objects()) > len(held)
    worker_heap.task_started()
    made = [[n] for n in range(10)]
    walked = gc.get_objects()  # what a collection now looks at: not the frozen objects
    assert len(walked) < len(held) and any(item is made[0] for item in walked)


def _nothing(read, read_values):
    return iter(())


def _stage_config() -> StageConfig:
    rules = MaterializerConfig(table="t", primary_key=("id",), on_conflict="error")
    return StageConfig(rules=rules, compaction="batch", state_ttl_ms=0, key_buckets=16)


@pytest.mark.parametrize("entry", ["source read", "net payload", "bucket stage", "key stage", "order and unzip"])
def test_every_task_entry_point_freezes_the_heap(entry: str):
    if entry == "source read":
        reader = ChangesStreamReader({"topics": "t", "bootstrap.servers": "127.0.0.1:9"}, pickle.dumps(_nothing))
        assert list(reader.read(MagicMock())) == []
    elif entry == "net payload":
        assert list(NetPayload(("id",))(iter(()))) == []
    elif entry == "bucket stage":
        BucketProcessor(_stage_config(), ("id",)).init(MagicMock())
    elif entry == "key stage":
        MaterializerProcessor(_stage_config()).init(MagicMock())
    else:
        OrderAndUnzipProcessor(MagicMock()).init(MagicMock())
    assert gc.get_freeze_count() > 0, f"the {entry} task did not freeze the worker's heap"
