"""Payload cells handed over in files (`rows.payload_spool`)."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pyarrow as pa

from service.config.settings import PipelineSettings
from service.kafka_to_delta.materialize.payload import payload_table
from service.kafka_to_delta.rows.ipc import ipc_bytes
from service.kafka_to_delta.rows.payload_spool import MARK, PayloadSpool, payload_spool, resolved
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


def test_a_payload_written_reads_back_the_same_uncompressed_and_clear_removes_the_files(tmp_path) -> None:
    spool = payload_spool("local", "p", str(tmp_path))
    assert spool is not None
    table = pa.table({"id": list(range(1000)), "text": [os.urandom(20).hex() for _ in range(1000)]})
    cell = spool.written(table)
    assert cell is not None and cell.startswith(MARK) and len(cell) < 200
    path = cell[len(MARK):].decode()
    assert open(path, "rb").read() == ipc_bytes(table, compressed=False)  # the stream as is, not compressed
    read = pa.ipc.open_stream(resolved(cell)).read_all()
    inline = ipc_bytes(table)
    assert read.equals(table) and resolved(inline) == inline
    spool.written(pa.table({"x": [1]}))
    assert len(os.listdir(spool.directory)) == 2
    spool.clear()
    assert os.listdir(spool.directory) == []
    assert read.equals(table)  # a payload read before keeps its pages
    spool.remove()
    assert not os.path.exists(spool.directory)
    assert PayloadSpool(spool.directory).written(table) is None  # the write failed: the caller goes inline


def test_the_driver_merges_payloads_written_to_a_spool_as_inline_ones(tmp_path) -> None:
    pipeline = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"])
    records = [(b'{"id":%d}' % i, b'{"op":"c","after":{"id":%d,"name":"n%d"}}' % (i, i)) for i in range(5)]
    spool = payload_spool("local[*]", "p", str(tmp_path))
    assert spool is not None
    (inline,) = PartitionReducer(batch_decoder(pipeline), ("id",))(lambda: iter(_batches(records, random.Random(0))))
    (handed,) = PartitionReducer(batch_decoder(pipeline), ("id",), spool=spool)(
        lambda: iter(_batches(records, random.Random(0))))
    assert all(cell.startswith(MARK) for cell in handed.column("payload").to_pylist())
    assert not any(cell.startswith(MARK) for cell in inline.column("payload").to_pylist())
    from_cells = batch_changes(pa.Table.from_batches([inline]))
    through_files = batch_changes(pa.Table.from_batches([handed]))
    assert through_files.changes.num_rows == 5 and through_files.changes.equals(from_cells.changes)
    assert through_files.vectorised == from_cells.vectorised == 1
    assert payload_table(resolved(handed.column("payload")[0].as_py()))[1]["vectorised"] is True


def test_a_spool_of_a_process_that_is_gone_is_removed_by_the_next_one(tmp_path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = tmp_path / "cdc-lakehouse-spool" / f"{gone.stdout.strip()}-p-x"
    orphan.mkdir(parents=True)
    (orphan / "payload").write_bytes(b"x")
    mine = payload_spool("local", "p", str(tmp_path))
    assert mine is not None and not orphan.exists() and os.path.isdir(mine.directory)


def test_a_write_that_fails_leaves_no_partial_file_and_hands_the_payload_inline(tmp_path, monkeypatch) -> None:
    from service.kafka_to_delta.rows import ipc
    from service.kafka_to_delta.materialize.payload import payload_batch

    spool = PayloadSpool(str(tmp_path))
    real_write = ipc.write_stream

    def full_disk(table: pa.Table, sink, compressed: bool) -> None:  # a file: half written, then the disk is full
        if not isinstance(sink, pa.OSFile):
            return real_write(table, sink, compressed)
        real_write(table.slice(0, table.num_rows // 2), sink, compressed)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ipc, "write_stream", full_disk)
    table = pa.table({"id": list(range(100))})
    assert spool.written(table) is None
    assert os.listdir(tmp_path) == []
    (cell,) = payload_batch(table, [], {}, spool=spool).column("payload").to_pylist()
    assert not cell.startswith(MARK) and pa.ipc.open_stream(cell).read_all().equals(table)  # inline
    assert os.listdir(tmp_path) == []
