"""The enrichment join's state tables (service/kafka_to_delta/joins/enrichment_state.py) with delta-rs, no Spark:
each write is made once per batch id, so a replayed batch changes nothing."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
from deltalake import DeltaTable

from connectors.kafka.range_reader import RAW_SCHEMA
from service.kafka_to_delta.joins.enrichment_rows import BUILD_CHANGES_SCHEMA
from service.kafka_to_delta.joins.enrichment_state import BuildState, GateLog, HeldProbes
from service.kafka_to_delta.joins.snapshot_gate import GateState


def _changes(*rows: tuple[str, str, bool]) -> pa.Table:
    return pa.table({"key": [r[0] for r in rows], "row": [r[1] for r in rows], "types": [None] * len(rows),
                     "deleted": [r[2] for r in rows]}, schema=BUILD_CHANGES_SCHEMA)


def _records(offsets: list[int]) -> pa.Table:
    now = datetime.now(timezone.utc)
    return pa.table({"key": [b"k"] * len(offsets), "value": [b"v"] * len(offsets), "topic": ["t"] * len(offsets),
                     "partition": [0] * len(offsets), "offset": offsets, "timestamp": [now] * len(offsets),
                     "headers": [[] for _ in offsets]}, schema=RAW_SCHEMA)


def test_build_state_keeps_the_latest_row_per_key_and_skips_replays(tmp_path):
    state = BuildState(str(tmp_path / "build"), None)
    state.apply(_changes(("[1]", '{"id":1,"v":"a"}', False), ("[2]", '{"id":2,"v":"b"}', False)), 0, 1_000)
    state.apply(_changes(("[1]", '{"id":1,"v":"A"}', False), ("[2]", '{"id":2}', True)), 1, 2_000)
    version = DeltaTable(state.uri).version()
    state.apply(_changes(("[1]", '{"id":1,"v":"replayed"}', False)), 1, 3_000)  # batch 1 again: skipped
    assert DeltaTable(state.uri).version() == version
    assert state.rows(["[1]", "[2]", "[3]"]) == {"[1]": ('{"id":1,"v":"A"}', None)}
    assert state.size() == 1



def test_build_rows_not_written_within_the_ttl_are_never_seen_then_removed(tmp_path):
    state = BuildState(str(tmp_path / "build"), None)
    state.apply(_changes(("[1]", '{"id":1}', False), ("[2]", '{"id":2}', False)), 0, 1_000)
    state.apply(_changes(("[2]", '{"id":2,"v":2}', False)), 1, 5_000)
    assert set(state.rows(["[1]", "[2]"], live_since_ms=1_000)) == {"[1]", "[2]"}
    assert set(state.rows(["[1]", "[2]"], live_since_ms=1_001)) == {"[2]"}  # key 1 expired: never seen
    assert state.expire(1_001, 2) == 1 and state.size() == 1
    version = DeltaTable(state.uri).version()
    assert state.expire(1_001, 3) == 0 and DeltaTable(state.uri).version() == version  # nothing to remove: no commit


def test_held_probes_are_added_once_per_batch_and_cleared_once(tmp_path):
    held = HeldProbes(str(tmp_path / "held"), None)
    held.hold(_records([0, 1]), 0)
    held.hold(_records([0, 1]), 0)  # a replay
    held.hold(_records([2]), 1)
    assert held.count() == 3 and held.all().column("offset").to_pylist() == [0, 1, 2]
    held.clear(2)
    held.hold(_records([5]), 2)  # a replay of batch 2 after the clear adds nothing
    assert held.count() == 0


def test_the_gate_state_a_batch_wrote_is_what_its_replay_reads(tmp_path):
    gate = GateLog(str(tmp_path / "gate"), None)
    assert gate.state_for(0) == (GateState(), False)
    closed = GateState(read_to={("t", 0): 3})
    opened = GateState(open=True, opened_in_batch=4, read_to={("t", 0): 9})
    gate.record(closed, 2)
    gate.record(opened, 4)
    gate.record(GateState(), 4)  # a replay of batch 4 keeps what batch 4 wrote
    assert gate.state_for(3) == (closed, False)
    assert gate.state_for(4) == (opened, True)
    assert gate.state_for(7) == (opened, False)
