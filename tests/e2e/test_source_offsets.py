"""Source offsets against the real broker: reads plan to the last stable offset (an open transaction
on an input partition never stalls a micro-batch), and offsets deleted before they were read are data
loss, reported with topic, partition and offsets, or skipped when the operator says so."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from service.operations.workload import create_topics
from tests.support.pipeline_harness import run_cli, table_rows, table_version, write_config

pytestmark = pytest.mark.slow


def _pipeline(topic: str, **extra) -> dict:
    return {"name": "p", "topics": [topic], "table": "t", "primary_key": ["id"],
            "from_changelog": {"preset": "flat"}, **extra}


def _send(producer: Producer, topic: str, partition: int, ids: range) -> None:
    for i in ids:
        producer.produce(topic, key=json.dumps({"id": i}).encode(),
                         value=json.dumps({"op": "INSERT", "id": i, "v": f"v{i}"}).encode(), partition=partition)
    assert producer.flush(60) == 0


def _ids(workdir) -> list[int]:
    return [row["id"] for row in table_rows(workdir / "tables" / "t")]


def test_an_open_transaction_on_an_input_partition_does_not_stall_a_micro_batch(kafka_bootstrap, unique, workdir):
    topic = f"open-txn-{unique}"
    create_topics(kafka_bootstrap, [topic], 2)
    plain = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    _send(plain, topic, 0, range(0, 5))
    pending = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"open-{unique}"})
    pending.init_transactions(30)
    pending.begin_transaction()
    _send(pending, topic, 0, range(100, 103))  # left open while the pipeline runs
    _send(plain, topic, 1, range(5, 10))
    config = write_config(workdir / "c.yaml", kafka_bootstrap, workdir, [_pipeline(topic)])
    result = run_cli(config, "--until-idle", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert _ids(workdir) == list(range(10)), "committed data on both partitions, nothing of the open transaction"
    pending.commit_transaction(30)
    result = run_cli(config, "--until-idle", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert _ids(workdir) == [*range(10), 100, 101, 102]


def test_records_deleted_before_they_were_read_fail_with_data_loss_or_resume_when_told(
    kafka_bootstrap, unique, workdir
):
    topic = f"loss-{unique}"
    create_topics(kafka_bootstrap, [topic], 2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    _send(producer, topic, 0, range(0, 10))
    _send(producer, topic, 1, range(10, 20))
    config = write_config(workdir / "c.yaml", kafka_bootstrap, workdir, [_pipeline(topic)])
    assert run_cli(config, "--until-idle").returncode == 0
    assert _ids(workdir) == list(range(20))
    _send(producer, topic, 0, range(20, 30))  # offsets 10..19 of partition 0
    _send(producer, topic, 1, range(30, 35))
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 15)]).values():
        future.result(30)  # offsets 10..14 of partition 0 are gone before the pipeline read them
    version = table_version(workdir / "tables" / "t")

    result = run_cli(config, "--until-idle")
    assert result.returncode == 1
    message = [line for line in result.stderr.splitlines() if line.startswith("error: ")][-1]
    assert "DataLoss" in message and f"topic={topic} partition=0: offsets 10..14" in message, message
    assert "on_data_loss: earliest" in message, "the error says how to resume"
    assert table_version(workdir / "tables" / "t") == version, "nothing of the batch was committed"

    resumed = write_config(workdir / "c.yaml", kafka_bootstrap, workdir, [_pipeline(topic, on_data_loss="earliest")])
    result = run_cli(resumed, "--until-idle")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "were deleted before they were read: resuming at offset 15" in result.stderr
    assert _ids(workdir) == [*range(20), *range(25, 35)]


def test_a_run_killed_while_writing_its_first_offsets_starts_again(kafka_bootstrap, unique, workdir):
    """A SIGKILL between Spark's temporary write of the batch-0 offsets and its rename leaves a hidden
    file in `offsets/`; Spark alone then refuses to start the query ("should be empty on batch 0")."""
    topic = f"first-batch-{unique}"
    create_topics(kafka_bootstrap, [topic], 1)
    _send(Producer({"bootstrap.servers": kafka_bootstrap}), topic, 0, range(3))
    offsets = workdir / "checkpoints" / "p" / "offsets"
    offsets.mkdir(parents=True)
    (offsets / ".0.cdccc0b8-6707-4491-8a59-21e238611936.tmp").write_bytes(b"")
    config = write_config(workdir / "c.yaml", kafka_bootstrap, workdir, [_pipeline(topic)])
    result = run_cli(config, "--until-idle", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "removed 1 abandoned write(s) of a killed run" in result.stderr
    assert _ids(workdir) == [0, 1, 2]
