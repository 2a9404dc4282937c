"""The cyclic collector is paused exactly while a batch's acyclic values are built, and resumes after.

Guards the knob `collector_paused` (docs/design/runtime-tuning.md) where it applies: the record-by-record
decode of a Kafka batch and the export's records built from Arrow columns. Each test fails when the
pause stops applying (the collector found running inside) or stops ending (found off afterwards).
"""

from __future__ import annotations

import gc
import json
from contextlib import contextmanager

import pyarrow as pa
import pytest

from connectors.kafka.range_reader import RAW_SCHEMA
from service.config.from_changelog import FromChangelogSettings
from service.delta_to_kafka.formats import columnar_records
from service.delta_to_kafka.formats.export_encoder import ExportEncoder
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder
from service.runtime.collector import collector_paused
from tests.unit.service.delta_to_kafka.formats.test_columnar_export import NOW, export, random_feed


@pytest.fixture(autouse=True)
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_the_pause_restores_what_it_found():
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled(), "an inner pause must not end an outer one"
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a failed burst")
    assert gc.isenabled()


def _raw_batch(values: list[bytes | None]) -> pa.RecordBatch:
    n = len(values)
    columns = {field.name: pa.nulls(n, field.type) for field in RAW_SCHEMA}
    columns.update(key=pa.array([b'{"id":%d}' % i for i in range(n)], pa.binary()), value=pa.array(values, pa.binary()),
                   topic=pa.array(["t"] * n), partition=pa.array([0] * n, RAW_SCHEMA.field("partition").type),
                   offset=pa.array(range(n), RAW_SCHEMA.field("offset").type))
    return pa.RecordBatch.from_pydict(columns, schema=RAW_SCHEMA)


def test_a_batch_is_decoded_with_the_collector_paused():
    seen: list[bool] = []

    def decode(value: bytes):
        seen.append(gc.isenabled())
        return json.loads(value), None

    decoder = ChangelogBatchDecoder(FromChangelogSettings(), ("id",), value_decoder=decode)
    out = decoder(_raw_batch([json.dumps({"op": "c", "after": {"id": i}}).encode() for i in range(3)]))
    assert out.num_rows == 3
    assert seen == [False, False, False]
    assert gc.isenabled()


def test_the_exports_records_are_built_with_the_collector_paused(monkeypatch):
    entered: list[bool] = []

    @contextmanager
    def watched():
        with collector_paused():
            entered.append(not gc.isenabled())
            yield

    monkeypatch.setattr(columnar_records, "collector_paused", watched)
    encoder = ExportEncoder(export({"preset": "debezium"}), clock=lambda: NOW)
    records = encoder._by_column(random_feed(3), int(NOW * 1000))
    assert records and entered and all(entered)
    assert gc.isenabled()
