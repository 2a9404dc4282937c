"""A database source's planning: ranges packed into tasks, keys naming primary keys, quarantine states."""

from __future__ import annotations

import json
import random

import pytest

from connectors.kafka.source import KafkaRange
from service.kafka_to_delta.formats.debezium_json import json_key
from service.kafka_to_delta.source.database_ranges import key_fields, pack
from service.runtime import quarantine
from tests.support.run_seed import run_seed

SEEDS = [0, 1, 2, 3, run_seed(1 << 30)]


@pytest.mark.parametrize("seed", SEEDS)
def test_packing_keeps_every_range_once_and_bounds_tasks(seed):
    rng = random.Random(seed)
    ranges = [KafkaRange(f"t{t}", p, 10, 10 + rng.randrange(1, 3_000)) for t in range(200) for p in range(2)]
    tasks = pack(ranges, min_tasks=2, pack_rows=50_000)
    packed = [(r.topic, r.partition, r.start, r.end) for task in tasks for r in task.ranges]
    assert sorted(packed) == sorted((r.topic, r.partition, r.start, r.end) for r in ranges), f"seed {seed}"
    total = sum(r.end - r.start for r in ranges)
    assert 2 <= len(tasks) <= max(2, -(-total // 50_000)) + 1, f"seed {seed}"
    assert pack(list(reversed(ranges)), 2, 50_000)[0].value == tasks[0].value  # a replay plans the same tasks


def test_packing_gives_every_core_a_task_and_a_large_range_its_own():
    ranges = [KafkaRange("big", 0, 0, 200_000), KafkaRange("a", 0, 0, 10), KafkaRange("b", 0, 0, 10)]
    tasks = pack(ranges, min_tasks=2, pack_rows=50_000)
    assert [[r.topic for r in task.ranges] for task in tasks][0] == ["big"]
    assert len(pack(ranges[1:], min_tasks=4)) == 2  # never more tasks than ranges
    assert pack([], 2) == []


@pytest.mark.parametrize(("key", "fields"), [
    (b'{"id": 7}', ("id",)),
    (b'{"tenant":"a","id":7}', ("tenant", "id")),
    (json.dumps({"schema": {"type": "struct", "fields": [{"field": "id", "type": "int32"}]},
                 "payload": {"id": 7}}).encode(), ("id",)),
    (b"7", None), (b"not json", None), (None, None), (b"{}", None),
])
def test_key_fields_name_the_primary_key(key, fields):
    assert key_fields(key, json_key) == fields


def test_quarantine_states_say_what_to_skip_and_what_to_read_again(tmp_path):
    path = str(tmp_path / "q" / quarantine.FILE_NAME)
    assert quarantine.read(path) == {}
    quarantine.write(path, {
        "a": {"state": quarantine.QUARANTINED, "topics": ["db.a"], "offsets": {"db.a": {"0": 5}}},
        "b": {"state": quarantine.RESUMING, "topics": ["db.b"], "offsets": {"db.b": {"0": 3, "1": 9}}},
    })
    skipped, rewound = quarantine.topic_states(quarantine.read(path))
    assert skipped == {"db.a"} and rewound == {"db.b": {"0": 3, "1": 9}}


def test_a_lone_large_range_is_cut_into_a_task_per_core_as_the_offset_recorded(tmp_path):
    from connectors.kafka import offsets as om
    from service.config.databases import DatabaseSettings
    from service.kafka_to_delta.source.database_ranges import DatabaseStreamReader

    database = DatabaseSettings(name="db", topic_pattern=r"db\.public\.(?P<table>.+)")
    options = {"bootstrap.servers": "unused:9092", "quarantineFile": str(tmp_path / "q.json"), "minPartitions": "2"}
    reader = DatabaseStreamReader(options, database, b"", min_tasks=2)
    start, end = {"db.public.big": {"0": 0}}, {"db.public.big": {"0": 100_000}, **reader._pieces()}
    tasks = reader.partitions(start, end)
    assert [[(r.start, r.end) for r in task.ranges] for task in tasks] == [[(0, 50_000)], [(50_000, 100_000)]]
    assert len(reader.partitions(start, {"db.public.big": {"0": 100_000}})) == 1  # planned before the cut
    assert om.planned_pieces(end) == (2, 1_000)
