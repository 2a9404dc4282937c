"""An export SIGKILLed at random points still publishes every change exactly once, in commit order.

A Delta table of 10,000 feed rows in 50 versions (inserts, updates via MERGE, deletes) is
exported by `tests/support/export_driver.py` in its own process group. The process is killed with
SIGKILL three times, as soon as the output topic's end passes a random mark (so most kills
land inside a transaction or just after its commit, before Spark's), restarted each time,
then run to the end. A read_committed consumer must see each feed row once, in version order.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from deltalake import DeltaTable

from service.operations.workload import create_topics
from tests.support.export_driver import consume
from tests.support.pipeline_harness import kill_group

# Four Spark start-ups on a busy two-core machine take 4 to 9 minutes.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

VERSIONS = 50
FIRST_INSERTS = 200
UPDATES, DELETES, INSERTS = 80, 20, 20  # per later version: 2 * 80 + 20 + 20 = 200 feed rows
KILLS = 3
RUN_TIMEOUT_S = 900
REPO = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([("id", pa.int64()), ("value", pa.string())])
SOURCE_SCHEMA = pa.schema([*SCHEMA, ("deleted", pa.bool_())])


def _merge(path: str, ids: list[int], deleted: list[bool], version: int) -> None:
    source = pa.table({"id": ids, "value": [f"v{version}-{i}" for i in ids], "deleted": deleted}, schema=SOURCE_SCHEMA)
    (DeltaTable(path).merge(source, "t.id = s.id", source_alias="s", target_alias="t")
     .when_matched_delete(predicate="s.deleted")
     .when_matched_update(updates={"value": "s.value"}, predicate="NOT s.deleted")
     .when_not_matched_insert(updates={"id": "s.id", "value": "s.value"}, predicate="NOT s.deleted")
     .execute())


def build_table(path: str, seed: int) -> None:
    """Version 0 creates the table; versions 1..50 hold 200 feed rows each."""
    rng = random.Random(seed)
    DeltaTable.create(path, SCHEMA, configuration={"delta.enableChangeDataFeed": "true"})
    alive = list(range(FIRST_INSERTS))
    _merge(path, alive, [False] * FIRST_INSERTS, 1)
    next_id = FIRST_INSERTS
    for version in range(2, VERSIONS + 1):
        touched = rng.sample(alive, UPDATES + DELETES)
        gone = set(touched[UPDATES:])
        new = list(range(next_id, next_id + INSERTS))
        next_id += INSERTS
        _merge(path, touched + new, [False] * UPDATES + [True] * DELETES + [False] * INSERTS, version)
        alive = [i for i in alive if i not in gone] + new


def _end_offset(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "sigkill-watch"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1]
    finally:
        consumer.close()


def _start(config: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.export_driver", str(config)], cwd=REPO, env=env,
        stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True,
    )


def _run(config: Path, log: Path, bootstrap: str, topic: str, kill_at: int | None) -> bool:
    """One driver run; killed once the topic's end reaches `kill_at`. True when it was killed."""
    process = _start(config, log)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while process.poll() is None:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            if kill_at is not None and _end_offset(bootstrap, topic) >= kill_at:
                kill_group(process)
                return True
            time.sleep(0.1)
    finally:
        if process.poll() is None:
            kill_group(process)
    assert process.returncode == 0, log.read_text()[-3000:]
    return False


def test_sigkilled_export_publishes_every_change_once_in_order(kafka_bootstrap, unique, tmp_path):
    rng = random.Random(unique)
    table, topic = str(tmp_path / "table"), f"export-out-{unique}"
    build_table(table, seed=7)
    expected = pa.table(DeltaTable(table).load_cdf(starting_version=0)).to_pylist()
    assert len(expected) == 10_000
    create_topics(kafka_bootstrap, [topic], 1)
    config = tmp_path / "export.json"
    config.write_text(json.dumps({
        "name": f"sigkill-{unique}", "table_uri": table, "topic": topic, "bootstrap": kafka_bootstrap,
        "checkpoint": str(tmp_path / "checkpoint"), "positions_topic": f"positions-{unique}",
        "max_versions_per_trigger": 2,
    }))
    log = tmp_path / "driver.log"
    kills = 0
    for _ in range(KILLS):
        mark = _end_offset(kafka_bootstrap, topic) + rng.randint(1, 2500)
        kills += _run(config, log, kafka_bootstrap, topic, kill_at=mark)
    _run(config, log, kafka_bootstrap, topic, kill_at=None)
    assert kills == KILLS, log.read_text()[-3000:]

    published = [json.loads(value) for _, value, _ in consume(kafka_bootstrap, topic)]
    seen = [(p["version"], p["change"], p["id"], p["value"]) for p in published]
    want = [(r["_commit_version"], r["_change_type"], r["id"], r["value"]) for r in expected]
    assert len(seen) == len(set(seen)) == 10_000
    assert sorted(seen) == sorted(want)
    assert [s[0] for s in seen] == sorted(s[0] for s in seen)  # commit order (one partition)
    per_key: dict[int, list[int]] = defaultdict(list)
    for version, _, key, _ in seen:
        per_key[key].append(version)
    assert all(versions == sorted(versions) for versions in per_key.values())
