"""`rebuild-state` end to end: a materialized pipeline runs over part of a Debezium workload; an
incompatible upgrade of its materializer (on_conflict error -> nothing) is refused; `rebuild-state`
seeds a new checkpoint from the Delta table; the upgraded pipeline runs over the rest of the
workload (updates and deletes of keys seen before the rebuild) and the table equals the replay of
the whole workload (the workload's own dictionary of final rows), and again after a restart of the
new checkpoint. The state has a TTL (event time, timers), far longer than the test.

The table is keyed by email while the topic's upsert key is id, so an update moves a row to another
primary key: its retraction of the old email row finds that row only in the seeded state, here
seeded from the table alone (the old state is moved out of reach). The negative control, a second pipeline over the same topic whose seed is emptied after the rebuild
(offsets kept), ends with rows the source no longer holds.

Two topics into one table (second test): a row's topic is read from the old checkpoint's state, and
the rebuilt run equals the new config run from the beginning.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from service.__main__ import app
from service.config.settings import load_settings
from service.kafka_to_delta.plan.checkpoint_state import read_old_state
from service.kafka_to_delta.plan.rebuilt_seed import SEED_DIR, SEED_ROWS
from service.operations.workload import DebeziumWorkload, create_topics, produce
from service.supervisor.runner import Runner
from tests.support.pipeline_harness import table_rows, write_config
from vocabulary.errors import ConfigError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

KEYS, FIRST, REST = 60, 240, 240


def _pipelines(topic: str, on_conflict: str) -> list[dict]:
    return [{"name": name, "topics": [topic], "table": name, "primary_key": ["email"], "upsert_key": ["id"],
             "on_conflict": on_conflict, "from_changelog": {"preset": "debezium"}, "state_ttl_seconds": 86400}
            for name in ("people", "control")]


def _empty_seed(checkpoint: Path) -> None:
    seed = checkpoint / SEED_DIR / SEED_ROWS
    pq.write_table(pq.read_table(seed).slice(0, 0), seed)


def _run_until_idle(config: Path) -> None:
    runner = Runner(load_settings(config))
    runner.start(until_idle=True)
    runner.wait()


def _by_email(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda row: row["email"])


def test_rebuild_state_then_run_equals_a_full_replay(spark, kafka_bootstrap, unique, workdir):
    topic = f"people.{unique}"
    create_topics(kafka_bootstrap, [topic], partitions=2)
    workload = DebeziumWorkload(topic, partitions=2, schema="always", seed=11)
    produce(kafka_bootstrap, workload.generate(FIRST, KEYS))
    seen_before = set(workload.table)
    old = write_config(workdir / "old.yaml", kafka_bootstrap, workdir, _pipelines(topic, "error"))
    new = write_config(workdir / "new.yaml", kafka_bootstrap, workdir, _pipelines(topic, "nothing"))
    _run_until_idle(old)
    table = workdir / "tables" / "people"
    assert _by_email(table_rows(table, "email")) == _by_email(workload.expected_rows())

    with pytest.raises(ConfigError) as refused:
        Runner(load_settings(new)).start(until_idle=True)
    message = str(refused.value)
    assert "operator 'people/materializer': on_conflict changed from 'error' to 'nothing'" in message
    assert "rebuild-state CONFIG --pipeline people" in message

    # people: its old state made unreadable, so the rows are seeded from the table alone; control: from its state
    (workdir / "checkpoints" / "people" / "state").rename(workdir / "people-state-elsewhere")
    for name, from_state in (("people", 0), ("control", len(seen_before))):
        rebuilt = CliRunner().invoke(app, ["rebuild-state", str(new), "--pipeline", name])
        assert rebuilt.exit_code == 0, rebuilt.output
        assert (f"{len(seen_before)} primary key(s) seeded, one live row each: {from_state} with where it came from "
                f"taken from the old checkpoint's state, {len(seen_before) - from_state} from the table alone"
                ) in rebuilt.output
        assert "old checkpoint moved to" in rebuilt.output and "limitations:" in rebuilt.output
    assert len([p for p in (workdir / "checkpoints").iterdir() if ".before-rebuild-" in p.name]) == 2
    _empty_seed(workdir / "checkpoints" / "control")

    rest = []
    while len(rest) < REST:  # changes of keys the table held at the rebuild: updates move rows, deletes remove them
        rest += workload.next_events(sorted(seen_before)[len(rest) % len(seen_before)])
    rest += workload.generate(REST // 4, KEYS * 2)
    produce(kafka_bootstrap, rest)
    _run_until_idle(new)
    expected = _by_email(workload.expected_rows())
    assert _by_email(table_rows(table, "email")) == expected
    unseeded = {row["email"] for row in table_rows(workdir / "tables" / "control", "email")}
    assert unseeded - {row["email"] for row in expected}, "without the seed, moved rows stay behind"

    # a restart of the new checkpoint (the seed stays in it) goes on from its own state
    produce(kafka_bootstrap, [event for key in sorted(seen_before)[:10] for event in workload.next_events(key)])
    _run_until_idle(write_config(workdir / "restart.yaml", kafka_bootstrap, workdir, _pipelines(topic, "nothing")[:1]))
    assert _by_email(table_rows(table, "email")) == _by_email(workload.expected_rows())
    # ... and the seed was applied once: the state holds exactly the live keys (a re-applied seed would bring
    # back the emails that keys had before the rebuild)
    checkpoint = workdir / "checkpoints" / "people"
    state = read_old_state(spark, checkpoint, max(int(p.name) for p in (checkpoint / "commits").iterdir()
                                                  if p.name.isdigit()))
    assert state is not None
    assert set(state.shown) == {json.dumps([row["email"]]) for row in workload.expected_rows()}


def _fan_in(name: str, topics: list[str], on_conflict: str) -> dict:
    return {"name": name, "topics": topics, "table": name, "primary_key": ["id"], "on_conflict": on_conflict,
            "from_changelog": {"preset": "debezium"}}


def test_two_topics_rebuilt_from_the_old_state_equal_a_fresh_run_of_the_new_config(spark, kafka_bootstrap, unique,
                                                                                   workdir):
    """Two topics claim ids of one table: the table cannot say which topic a row came from, the old
    checkpoint's state can. Under `error` the topics keep to their own ids; after the upgrade to
    `deduplicate` they claim each other's and retract them. The reference is the new config run from the
    beginning as a new pipeline (a new pipeline is a compatible change)."""
    a, b = f"fan.a.{unique}", f"fan.b.{unique}"
    create_topics(kafka_bootstrap, [a, b], partitions=1)
    source_a, source_b = (DebeziumWorkload(topic, partitions=1, schema="always", seed=seed)
                          for topic, seed in ((a, 21), (b, 22)))
    produce(kafka_bootstrap, source_a.generate(80, 20) + [
        event for i in range(60) for event in source_b.next_events(100 + i % 20)])
    live = len(source_a.table) + len(source_b.table)
    old = write_config(workdir / "old.yaml", kafka_bootstrap, workdir, [_fan_in("fan", [a, b], "error")])
    new = write_config(workdir / "new.yaml", kafka_bootstrap, workdir, [
        _fan_in("fan", [a, b], "deduplicate"), _fan_in("fan_replay", [a, b], "deduplicate")])
    _run_until_idle(old)

    rebuilt = CliRunner().invoke(app, ["rebuild-state", str(new), "--pipeline", "fan"])
    assert rebuilt.exit_code == 0, rebuilt.output
    assert f"{live} primary key(s) seeded, one live row each: {live} with where it came from" in rebuilt.output

    claims = [event for i in range(40) for event in source_b.next_events(i % 20)]  # b claims a's ids, then retracts
    produce(kafka_bootstrap, claims + source_a.generate(40, 20))
    _run_until_idle(new)
    rows = table_rows(workdir / "tables" / "fan")
    assert rows == table_rows(workdir / "tables" / "fan_replay")
    assert {row["id"] for row in rows} & set(range(20)) and {row["id"] for row in rows} & set(range(100, 120))
