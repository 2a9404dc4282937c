"""A pipeline whose Delta commits run behind its micro-batches (`commits_behind`, the default): a commit that
fails after Spark committed its batch stops the pipeline with that error, its changes stay written ahead in
the checkpoint, and the next start commits them before anything else, so the table equals the input.

The failing commit is a double (the MERGE raises once): a real table cannot be made to refuse one commit on
demand. Everything else is real: Apache Kafka, Spark's streaming query and checkpoint, the delta-rs table."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer

from service.config.settings import settings_from_mapping
from service.kafka_to_delta.sink import merge_sink
from service.kafka_to_delta.sink.commits_behind import FOLDER, written_ahead
from service.operations.workload import create_topics
from service.supervisor.runner import Runner
from tests.support.pipeline_harness import table_rows


def _produce(bootstrap: str, topic: str, rows: list[dict]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for row in rows:
        value = {"before": None, "after": row, "op": "c"}
        producer.produce(topic, key=json.dumps({"id": row["id"]}).encode(), value=json.dumps(value).encode(),
                         partition=0)
    assert producer.flush(30) == 0


def _run(bootstrap: str, topic: str, workdir, max_offsets: int = 2) -> Runner:
    settings = settings_from_mapping({
        "kafka": {"bootstrap_servers": bootstrap},
        "lakehouse": {"root": str(workdir / "tables")},
        "checkpoint_root": str(workdir / "checkpoints"),
        # The refusal is not retried (an unrecognised error); a restart in this process after a failed
        # `foreachBatch` can meet a crashed data-source planning process (transient, retried).
        "recovery": {"max_attempts": 3, "initial_backoff_seconds": 0.1},
        "pipelines": [{"name": "behind", "topics": [topic], "table": "t", "primary_key": ["id"],
                       "max_offsets_per_trigger": max_offsets}],
    })
    runner = Runner(settings)
    runner.start(until_idle=True)
    runner.wait()
    return runner


def test_a_commit_failed_behind_its_batch_is_committed_at_the_next_start(spark, kafka_bootstrap, unique, workdir,
                                                                          monkeypatch):
    topic = f"behind-{unique}"
    create_topics(kafka_bootstrap, [topic], 1)
    rows = [{"id": i, "name": f"n{i}"} for i in range(6)]
    _produce(kafka_bootstrap, topic, rows)
    real = merge_sink.MergeSink.apply_typed
    refused = []

    def refuse_batch_one(self, changes, app_id, batch_id, truncate=False):
        if batch_id == 1 and not refused:
            refused.append(batch_id)
            raise RuntimeError("commit refused by the test's double")
        return real(self, changes, app_id, batch_id, truncate)

    monkeypatch.setattr(merge_sink.MergeSink, "apply_typed", refuse_batch_one)
    with pytest.raises(Exception, match="commit refused by the test's double"):
        _run(kafka_bootstrap, topic, workdir)
    ahead = workdir / "checkpoints" / "behind" / FOLDER
    assert [p.name for p in ahead.glob("*.arrow")] == ["1.arrow"]
    assert sorted(r["id"] for r in table_rows(workdir / "tables" / "t")) == [0, 1]

    runner = _run(kafka_bootstrap, topic, workdir)
    assert sorted((r["id"], r["name"]) for r in table_rows(workdir / "tables" / "t")) == \
        [(r["id"], r["name"]) for r in rows]
    assert list(ahead.glob("*.arrow")) == []
    assert runner.supervised[0].pipeline.commits is not None, "the pipeline committed behind its batches"


def test_a_partition_read_in_pieces_is_written_ahead_unjoined_and_joined_at_the_replay(spark, kafka_bootstrap, unique,
                                                                                       workdir, monkeypatch):
    """One batch of a one-partition topic, read in two pieces that both change every key: its ranges' rows are
    written ahead as they are (the join is left to the commit), and the replay after the refused commit joins
    them: each key's last change, as if the commit had not failed."""
    topic = f"behind-pieces-{unique}"
    create_topics(kafka_bootstrap, [topic], 1)
    keys, revisions = 1_000, 3  # 3,000 records: pieces of at least 1,000 records (the source's default)
    rows = [{"id": i, "name": f"n{i}-r{r}"} for r in range(revisions) for i in range(keys)]
    _produce(kafka_bootstrap, topic, rows)
    real = merge_sink.MergeSink.apply_typed
    refused = []

    def refuse_batch_zero(self, changes, app_id, batch_id, truncate=False):
        if batch_id == 0 and not refused:
            refused.append(batch_id)
            raise RuntimeError("commit refused by the test's double")
        return real(self, changes, app_id, batch_id, truncate)

    monkeypatch.setattr(merge_sink.MergeSink, "apply_typed", refuse_batch_zero)
    with pytest.raises(Exception, match="commit refused by the test's double"):
        _run(kafka_bootstrap, topic, workdir, max_offsets=len(rows))
    ahead = workdir / "checkpoints" / "behind" / FOLDER
    (written,) = written_ahead(ahead)
    assert written.batch_id == 0 and written.unjoined == (), "the ranges' rows were written ahead unjoined"
    assert written.changes.num_rows > keys, "the pieces both changed the keys"

    _run(kafka_bootstrap, topic, workdir, max_offsets=len(rows))
    assert sorted((r["id"], r["name"]) for r in table_rows(workdir / "tables" / "t")) == \
        [(i, f"n{i}-r{revisions - 1}") for i in range(keys)]
    assert list(ahead.glob("*.arrow")) == []
