"""A checkpoint written by the tree before the regrouping (41c9bfd) resumes under the current code.

`fixtures/checkpoint_41c9bfd/` is what `cdc-lakehouse run CONFIG --until-idle` at 41c9bfd left after the
first 300 records of a deterministic Debezium workload: three pipelines over one topic (a materializer
with `sequence_by` and tombstones, a materializer keyed by email over a topic keyed by id, the plain
path), their checkpoints (offset and commit logs, RocksDB state, the stored plan) and their Delta
tables. How it was made and how to make it again: `tests/support/old_checkpoint.py`.

The test produces the same records (same keys, partitions and timestamps, so the same offsets) and
300 more to a fresh topic of the same name, runs the current CLI on a copy of the fixture, and checks
that the stored plan is accepted unchanged, that every pipeline resumes after its last stored batch
(same query, so the same Delta app id; no batch from 0 again; the first new batch starts where the old
offsets ended) and that every table equals the workload's final table.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support import old_checkpoint as old
from tests.support.pipeline_harness import run_cli, table_rows

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint_41c9bfd"
SORT_KEY = {"people": "id", "by_email": "email", "plain": "id"}


def _batches(directory: Path) -> list[int]:
    """The batch ids of a Spark log directory (offsets/ or commits/)."""
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _source_offsets(checkpoint: Path, batch: int) -> dict[str, dict[str, int]]:
    """The Kafka end offsets Spark's offset log holds for `batch` (per topic, per partition)."""
    source = (checkpoint / "offsets" / str(batch)).read_text().splitlines()[2]
    return {topic: offsets for topic, offsets in json.loads(source).items() if not topic.startswith("$")}


def _delta_txns(table: Path) -> list[tuple[int, str, int]]:
    """(table version, app id, batch id) of every commit of the table that carries a transaction."""
    found = []
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                found.append((int(commit.stem), action["txn"]["appId"], action["txn"]["version"]))
    return found


def _logged_batches(log: str, pipeline: str) -> list[int]:
    """The batch ids the CLI logged as committed for `pipeline`."""
    return [int(b) for b in re.findall(rf"pipeline {pipeline}: batch (\d+) -> ", log)]


def test_a_checkpoint_of_41c9bfd_resumes(kafka_bootstrap, workdir):
    old.reset_topic(kafka_bootstrap)
    assert old.produce(kafka_bootstrap, first=True) == old.FIRST
    old.produce(kafka_bootstrap, first=False)
    old.install(FIXTURE, workdir)
    checkpoints, tables = workdir / old.CHECKPOINTS, workdir / old.TABLES
    before = {name: {"batch": _batches(checkpoints / name / "offsets")[-1],
                     "plan": (checkpoints / name / "plan.json").read_text(),
                     "txns": _delta_txns(tables / name)} for name in SORT_KEY}

    done = run_cli(old.config(workdir / "config.yaml", kafka_bootstrap, workdir), "--until-idle")
    assert done.returncode == 0, done.stderr[-4000:]
    log = done.stderr + done.stdout
    assert "compatible plan change" not in log and "rebuild-state" not in log, log[-4000:]

    workload, _ = old.workload_events(first=False)
    for name, order in SORT_KEY.items():
        last, checkpoint = before[name]["batch"], checkpoints / name
        # the stored plan is the one the current code compiles, to the byte
        assert (checkpoint / "plan.json").read_text() == before[name]["plan"], name
        logged = _logged_batches(log, name)
        assert logged and min(logged) == last + 1, (name, last, logged)
        assert _batches(checkpoint / "commits")[-1] >= last + 1
        # the first new batch starts where the old run ended: its end offsets lie beyond them
        ended, first_new = _source_offsets(checkpoint, last), _source_offsets(checkpoint, last + 1)
        assert all(first_new[old.TOPIC][p] >= end for p, end in ended[old.TOPIC].items()), (ended, first_new)
        old_txns, txns = before[name]["txns"], _delta_txns(tables / name)
        assert txns[: len(old_txns)] == old_txns
        app_ids = {app for _, app, _ in txns}
        assert len(app_ids) == 1, f"{name}: the resumed query commits under another app id: {app_ids}"
        new_batches = [batch for _, _, batch in txns[len(old_txns):]]  # a batch without changes commits nothing
        assert new_batches and min(new_batches) > last and set(new_batches) <= set(logged), (name, new_batches)
        expected = sorted(workload.expected_rows(), key=lambda row: row[order])
        assert table_rows(tables / name, order) == expected, name
