"""Payload cells handed over in files (`rows.payload_spool`)."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pyarrow as pa

from service.config.settings import PipelineSettings
from service.kafka_to_delta.rows.payload_spool import MARK, PayloadSpool, handed_payloads, payload_spool, resolved
from service.kafka_to_delta.source.batch_changes import batch_changes
from service.kafka_to_delta.source.decode_stage import batch_decoder
from service.kafka_to_delta.source.partition_changes import PartitionReducer
from tests.unit.service.kafka_to_delta.source.test_debezium_columns import _batches


def test_only_a_local_master_gets_a_spool(tmp_path) -> None:
    assert payload_spool("spark://host:7077", "p", str(tmp_path)) is None
    assert payload_spool("yarn", "p", str(tmp_path)) is None
    spool = payload_spool("local[2]", "a pipeline/name", str(tmp_path))
    assert spool is not None and os.path.isdir(spool.directory)
    assert os.path.basename(spool.directory).startswith(f"{os.getpid()}-a_pipeline_name-")


def test_no_spool_where_no_directory_can_be_made(tmp_path) -> None:
    blocked = tmp_path / "a file"
    blocked.write_bytes(b"")
    assert payload_spool("local[2]", "p", str(blocked)) is None  # the payloads then go inline


def test_a_payload_handed_over_reads_back_the_same_and_clear_removes_the_files(tmp_path) -> None:
    spool = payload_spool("local", "p", str(tmp_path))
    assert spool is not None
    payload = b"\xff\xff\xff\xff" + os.urandom(1000)
    cell = spool.handed(payload)
    assert cell.startswith(MARK) and len(cell) < 200
    assert resolved(cell) == payload and resolved(payload) == payload
    spool.handed(b"x")
    assert len(os.listdir(spool.directory)) == 2
    spool.clear()
    assert os.listdir(spool.directory) == []
    spool.remove()
    assert not os.path.exists(spool.directory)
    assert PayloadSpool(spool.directory).handed(payload) == payload  # the write failed: inline


def test_the_driver_merges_handed_payloads_as_inline_ones(tmp_path) -> None:
    pipeline = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"])
    records = [(b'{"id":%d}' % i, b'{"op":"c","after":{"id":%d,"name":"n%d"}}' % (i, i)) for i in range(5)]
    (batch,) = PartitionReducer(batch_decoder(pipeline), ("id",))(lambda: iter(_batches(records, random.Random(0))))
    spool = payload_spool("local[*]", "p", str(tmp_path))
    assert spool is not None
    handed = handed_payloads(batch, spool)
    assert all(cell.startswith(MARK) for cell in handed.column("payload").to_pylist())
    inline = batch_changes(pa.Table.from_batches([batch]))
    through_files = batch_changes(pa.Table.from_batches([handed]))
    assert through_files.changes.num_rows == 5 and through_files.changes.equals(inline.changes)
    assert through_files.vectorised == inline.vectorised == 1


def test_a_spool_of_a_process_that_is_gone_is_removed_by_the_next_one(tmp_path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = tmp_path / "cdc-lakehouse-spool" / f"{gone.stdout.strip()}-p-x"
    orphan.mkdir(parents=True)
    (orphan / "payload").write_bytes(b"x")
    mine = payload_spool("local", "p", str(tmp_path))
    assert mine is not None and not orphan.exists() and os.path.isdir(mine.directory)


def test_a_write_that_fails_leaves_no_partial_file_and_hands_the_payload_inline(tmp_path, monkeypatch) -> None:
    from service.kafka_to_delta.rows import payload_spool as module

    spool = PayloadSpool(str(tmp_path))
    real_open = open

    class FullDisk:  # the file is made, half the payload written, then the disk is full
        def __init__(self, path: str, mode: str) -> None:
            self.file = real_open(path, mode)

        def __enter__(self) -> "FullDisk":
            return self

        def __exit__(self, *exc) -> None:
            self.file.close()

        def write(self, data: bytes) -> None:
            self.file.write(data[:len(data) // 2])
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(module, "open", FullDisk, raising=False)
    payload = b"\xff\xff\xff\xff" + bytes(1000)
    assert spool.handed(payload) == payload
    assert os.listdir(tmp_path) == []
