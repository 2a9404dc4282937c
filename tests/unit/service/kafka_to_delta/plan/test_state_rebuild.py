"""`rebuild-state` without Spark: the seeded state under the materializer's rules, the cut taken from
the checkpoint and the Delta commits, the old checkpoint moved aside, and each refusal."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake
from typer.testing import CliRunner

from service.__main__ import app
from service.config.settings import settings_from_mapping
from service.kafka_to_delta.materialize.key_state import LiveRow, Tombstone, decode_state
from service.kafka_to_delta.materialize.rules import Change, Materializer, MaterializerConfig
from service.kafka_to_delta.pipeline import app_id
from service.kafka_to_delta.plan.checkpoint_state import OldState
from service.kafka_to_delta.plan.compiled_plan import pipeline_operators
from service.kafka_to_delta.plan.rebuilt_seed import SEED_DIR, SEED_INFO, SEED_ROWS
from service.kafka_to_delta.plan.state_rebuild import rebuild_state, seed_states
from service.kafka_to_delta.plan.upgrades import PLAN_FILE, check_and_store
from vocabulary.changes import ChangeKind
from vocabulary.errors import ConfigError

QUERY_ID = "2f1d6c3e-0000-4000-8000-000000000001"
PIPELINE = {"name": "people", "topics": ["people"], "table": "people", "primary_key": ["email"],
            "upsert_key": ["id"], "on_conflict": "nothing"}
ROWS = [{"id": 1, "email": "a@x", "name": "Ann", "score": 1.5}, {"id": 2, "email": "b@x", "name": "Bob", "score": 2.5}]


def _config(root: Path, **update: Any) -> dict[str, Any]:
    return {"lakehouse": {"root": str(root / "tables")}, "checkpoint_root": str(root / "checkpoints"),
            "pipelines": [{**copy.deepcopy(PIPELINE), **update}]}


def _old_checkpoint(root: Path, batches: int = 3) -> Path:
    """A checkpoint of `batches` micro-batches whose last one the table holds."""
    checkpoint = root / "checkpoints" / "people"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "metadata").write_text(json.dumps({"id": QUERY_ID}))
    for batch in range(batches):
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1_700_000_000_000 + batch}
        offsets = {"people": {"0": 10 * (batch + 1), "1": 5 * (batch + 1)}}
        (checkpoint / "offsets" / str(batch)).write_text(f"v1\n{json.dumps(meta)}\n{json.dumps(offsets)}")
    settings = settings_from_mapping(_config(root))
    write_deltalake(str(root / "tables" / "people"), pa.Table.from_pylist(ROWS), commit_properties=CommitProperties(
        app_transactions=[Transaction(app_id(settings.pipelines[0], QUERY_ID), batches - 2)]))
    return checkpoint


def test_a_seeded_key_behaves_as_if_its_row_had_been_applied():
    pipeline = settings_from_mapping({"pipelines": [PIPELINE]}).pipelines[0]
    seed = seed_states([ROWS[0]], pipeline, touched_ms=5)
    assert seed["group_key"] == ['["a@x"]'] and seed["touched"] == [5]
    rules = Materializer(MaterializerConfig("people", ("email",), "nothing"))

    def change(kind: ChangeKind, row: dict[str, Any]) -> Change:
        return Change(kind, f"[{row['id']}]", json.dumps(row), ("people", 0, 99))

    other = {"id": 7, "email": "a@x", "name": "Eve"}
    conflict = rules.apply('["a@x"]', seed["state"][0], [change(ChangeKind.INSERT, other)], 0)
    assert conflict.net is None and conflict.counters.conflicts == 1  # the seeded row is the current winner
    deleted = rules.apply('["a@x"]', seed["state"][0], [change(ChangeKind.DELETE, ROWS[0])], 0)
    assert deleted.net is not None and deleted.net.kind == "delete"  # its retraction finds it


def test_rebuild_moves_the_checkpoint_aside_and_seeds_a_new_one_at_the_tables_batch(tmp_path):
    old = _old_checkpoint(tmp_path)
    report = rebuild_state(settings_from_mapping(_config(tmp_path)), "people",
                           now=datetime(2026, 11, 23, 8, 0, tzinfo=timezone.utc))
    assert report.moved_to == old.with_name("people.before-rebuild-20261123T080000Z")
    assert (report.moved_to / "offsets" / "2").exists() and not (old / "offsets").exists()
    info = json.loads((old / SEED_DIR / SEED_INFO).read_text())
    assert info["batch"] == 1 and info["starting_offsets"] == {"people": {"0": 20, "1": 10}}  # batch 1's end
    seeded = pq.read_table(old / SEED_DIR / SEED_ROWS).to_pylist()
    assert sorted(row["group_key"] for row in seeded) == ['["a@x"]', '["b@x"]']
    assert {row["touched"] for row in seeded} == {1_700_000_000_001}
    text = "\n".join(report.lines())
    assert "2 primary key(s) seeded, one live row each: 0 with where it came from" in text and "people[0]@20, people[1]@10" in text and "limitations:" in text


def test_the_command_prints_what_it_did_and_refuses_a_second_rebuild_before_a_run(tmp_path):
    _old_checkpoint(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(_config(tmp_path)))
    first = CliRunner().invoke(app, ["rebuild-state", str(config), "--pipeline", "people"])
    assert first.exit_code == 0, first.output
    assert "old checkpoint moved to" in first.output and "deduplicate" in first.output
    again = CliRunner().invoke(app, ["rebuild-state", str(config), "--pipeline", "people"])
    assert again.exit_code == 1 and "has not run yet" in again.output


@pytest.mark.parametrize("update, reason", [
    ({"topics": ["a", "b"], "on_conflict": "deduplicate"}, "several topics feed the table"),
    ({"upsert_key": [], "on_conflict": "deduplicate"}, "no upsert key"),
    ({"upsert_key": None, "on_conflict": None, "primary_key": ["id"]}, "no materializer"),
    ({"name": "other"}, "no started checkpoint"),
    ({"primary_key": ["score"]}, "key column 'score' is double"),
])
def test_what_the_table_cannot_rebuild_is_refused(tmp_path, update, reason):
    _old_checkpoint(tmp_path)
    name = update.get("name", "people")
    with pytest.raises(ConfigError, match=reason):
        rebuild_state(settings_from_mapping(_config(tmp_path, **update)), name)


def test_a_checkpoint_that_buffered_changes_for_the_watermark_is_refused(tmp_path):
    old = _old_checkpoint(tmp_path)
    plan = {"nodes": [{"id": "people/materializer", "kind": "materializer", "properties": {"compaction": "watermark"}}]}
    (old / PLAN_FILE).write_text(json.dumps(plan))
    with pytest.raises(ConfigError, match="not in the table yet"):
        rebuild_state(settings_from_mapping(_config(tmp_path)), "people")
    assert (old / "offsets").exists()  # nothing moved


def test_origins_come_from_the_old_state_where_it_holds_the_key(tmp_path):
    """Two topics: the table cannot tell a row's topic; the old state can. A row it no longer holds is left
    unseeded (the old pipeline had forgotten it too); a deleted key keeps its tombstone."""
    fan_in = {"topics": ["people.a", "people.b"], "sequence_by": ["source.lsn"]}
    settings = settings_from_mapping(_config(tmp_path, **fan_in))
    old = _old_checkpoint(tmp_path)
    check_and_store("people", str(old), pipeline_operators(settings.pipelines[0]))  # the plan it ran under
    shown = LiveRow('["people.b",[1]]', '{"id":1,"email":"a@x","name":"Ann","score":1.5}', ("people.b", 1, 41), (7,))
    buried = Tombstone((9,), ("people.a", 0, 12), 1_000)
    asked = []

    def reader(checkpoint: Path, batch: int) -> OldState:
        asked.append((checkpoint, batch))
        return OldState({'["a@x"]': shown}, {'["c@x"]': {'["people.a",[3]]': buried}})

    report = rebuild_state(settings, "people", read_state=reader)
    assert asked == [(old, 1)]
    assert (report.counts.with_origin, report.counts.from_table, report.counts.unseeded,
            report.counts.tombstones_only) == (1, 0, 1, 1)
    seeded = {row["group_key"]: decode_state(row["state"]) for row in pq.read_table(old / SEED_DIR / SEED_ROWS).to_pylist()}
    assert seeded['["a@x"]'].rows == [shown]
    assert seeded['["c@x"]'].rows == [] and seeded['["c@x"]'].tombstones == {'["people.a",[3]]': buried}
    assert "1 row(s) the old state no longer held left unseeded" in "\n".join(report.lines())


def test_without_a_readable_old_state_what_the_table_cannot_tell_is_refused(tmp_path):
    _old_checkpoint(tmp_path)
    settings = settings_from_mapping(_config(tmp_path, topics=["a", "b"]))
    with pytest.raises(ConfigError, match="several topics feed the table.*cannot be used"):
        rebuild_state(settings, "people", read_state=lambda checkpoint, batch: None)
