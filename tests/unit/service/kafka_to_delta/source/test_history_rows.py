"""A history pipeline's row changes as its Kafka ranges hand them over (`history_rows`), on real Debezium
envelopes through the real decoder (no Spark): the vectorised way (`HistoryColumns`) against the
record-by-record way (`changelog_history`, the reference), and what the history sink makes of them.

Seeds: `FIXED_SEEDS` plus one random seed, printed in the failure message.
"""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest

from connectors.delta.delta_rs import DeltaSchemaError
from service.config.settings import PipelineSettings
from service.kafka_to_delta.materialize.payload import HISTORY
from service.kafka_to_delta.materialize.payload import HISTORY_SEQUENCE as SEQUENCE
from service.kafka_to_delta.rows.arrow import PAYLOAD_SCHEMA
from service.kafka_to_delta.rows.names import Meta
from service.kafka_to_delta.sink.history_sink import batch_events
from service.kafka_to_delta.sink.history_versions import IS_DELETE, UNCHANGED
from service.kafka_to_delta.source.batch_changes import BatchChanges, batch_changes
from service.kafka_to_delta.source.decode_stage import batch_decoder
from service.kafka_to_delta.source.partition_changes import PartitionReducer
from service.operations.workload import DebeziumWorkload
from tests.support.run_seed import run_seed
from tests.unit.service.kafka_to_delta.source.test_partition_changes import _key, _records, _split

FIXED_SEEDS = (0, 7, 994)
RANDOM_SEED = run_seed(1_000_000)
_POSITION = [(c, "ascending") for c in (Meta.TOPIC, Meta.PARTITION, Meta.OFFSET, Meta.CHANGE_INDEX)]


def _pipeline(sequence_by: str) -> PipelineSettings:
    return PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"],
                            from_changelog={"preset": "debezium"}, history={"sequence_by": [sequence_by]})


def _batch(pipeline: PipelineSettings, ranges: list[list[pa.RecordBatch]], vectorised: bool) -> BatchChanges:
    payloads = []
    for batches in ranges:
        reducer = PartitionReducer(batch_decoder(pipeline), pipeline.primary_key, vectorised=vectorised,
                                   history=pipeline.history_sequence_by)
        payloads.append(pa.Table.from_batches(list(reducer(lambda: iter(batches))), schema=PAYLOAD_SCHEMA))
    return batch_changes(pa.concat_tables(payloads))


def _both_ways(pipeline: PipelineSettings, ranges: list[list[pa.RecordBatch]]) -> tuple[BatchChanges, pa.Table]:
    """(the vectorised way's batch, its history part), checked equal to the record-by-record way's."""
    fast, reference = _batch(pipeline, ranges, True), _batch(pipeline, ranges, False)
    assert fast.history is not None and reference.history is not None
    found, expected = fast.history.sort_by(_POSITION), reference.history.sort_by(_POSITION)
    assert found.schema == expected.schema
    assert found.to_pylist() == expected.to_pylist()
    assert fast.changes.sort_by(_POSITION).to_pylist() == reference.changes.sort_by(_POSITION).to_pylist()
    return fast, found


@pytest.mark.parametrize("seed", [*FIXED_SEEDS, RANDOM_SEED])
def test_every_change_of_the_workload_is_handed_over_typed_as_the_record_by_record_way_gives_it(seed):
    rng = random.Random(seed)
    workload = DebeziumWorkload("t", 3, "mixed", seed=seed)
    events = workload.generate(2_000, 300)
    ranges = [_split(_records([(e.key, e.value) for e in events if e.partition == p], p), rng) for p in range(3)]
    fast, history = _both_ways(_pipeline("ts_ms"), ranges)
    where = f"seed {seed}"
    assert fast.vectorised == 3 and fast.record_by_record == 0, where
    assert history.num_rows == fast.count, where  # every change, an update's before image included
    documents = [json.loads(e.value) for e in events if e.value is not None]
    expected = sorted(doc.get("payload", doc)["ts_ms"] for doc in documents
                      for _ in range(2 if doc.get("payload", doc)["op"] == "u" else 1))
    assert sorted(history.column(SEQUENCE).to_pylist()) == expected, where


def _change(op: str, before: dict | None, after: dict | None, lsn: int | None) -> bytes:
    source = {} if lsn is None else {"lsn": lsn}
    return json.dumps({"before": before, "after": after, "op": op, "source": source, "ts_ms": 5}).encode()


_CHANGES = [
    (_key(1), _change("c", None, {"id": 1, "a": "x", "note": "long"}, 10)),
    (_key(1), _change("u", {"id": 1, "a": "x", "note": "long"}, {"id": 1, "a": "y",
                                                                 "note": "__debezium_unavailable_value"}, 11)),
    (_key(2), _change("c", None, {"id": 2, "a": "x", "note": "n"}, 12)),
    (_key(2), _change("d", {"id": 2, "a": "x", "note": "n"}, None, 13)),
    (_key(2), None),
    (_key(1), _change("u", None, {"id": 1, "a": "z", "note": "short"}, 14)),
]


def test_a_nested_sequence_path_placeholders_before_images_and_deletes():
    _, history = _both_ways(_pipeline("source.lsn"), [[_records(_CHANGES)]])
    rows = [(r["id"], r[Meta.KIND], r[SEQUENCE], r[Meta.UNCHANGED]) for r in history.to_pylist()]
    assert rows == [(1, "+U", 10, None), (1, "-U", 11, None), (1, "+U", 11, '["note"]'), (2, "+U", 12, None),
                    (2, "-D", 13, None), (1, "+U", 14, None)]
    assert history.column("note").to_pylist()[2] is None  # left to the history's fill from the key's events
    events = batch_events(history, "h")  # the update's before image is not an event
    assert sorted(zip(events.column("id").to_pylist(), events.column("__START_AT").to_pylist(),
                      events.column(IS_DELETE).to_pylist())) == [
        (1, 10, False), (1, 11, False), (1, 14, False), (2, 12, False), (2, 13, True)]
    assert events.column(UNCHANGED).null_count == events.num_rows - 1


def test_a_sequence_that_names_a_row_column_is_taken_from_the_image_the_record_by_record_way():
    changes = [(_key(1), json.dumps({"before": None, "after": {"id": 1, "seq": 3}, "op": "c"}).encode()),
               (_key(1), json.dumps({"before": None, "after": {"id": 1, "seq": 9}, "op": "u"}).encode())]
    fast, history = _both_ways(_pipeline("seq"), [[_records(changes)]])
    assert fast.record_by_record == 1 and history.column(SEQUENCE).to_pylist() == [3, 9]


def test_a_change_without_a_sequence_value_stops_the_batch_naming_it():
    changes = [*_CHANGES[:2], (_key(3), _change("c", None, {"id": 3, "a": "x", "note": "n"}, None))]
    fast = _batch(_pipeline("source.lsn"), [[_records(changes, partition=4, first=70)]], True)
    assert fast.vectorised == 1 and fast.history is not None
    with pytest.raises(DeltaSchemaError, match=r"no sequence value .*partition=4 offset=72"):
        batch_events(fast.history, "h")


def test_a_pipeline_without_history_sends_no_history_part():
    pipeline = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"],
                                from_changelog={"preset": "debezium"})
    reducer = PartitionReducer(batch_decoder(pipeline), pipeline.primary_key)
    payload = pa.Table.from_batches(list(reducer(lambda: iter([_records(_CHANGES)]))), schema=PAYLOAD_SCHEMA)
    assert HISTORY not in payload.column("part").to_pylist() and batch_changes(payload).history is None
