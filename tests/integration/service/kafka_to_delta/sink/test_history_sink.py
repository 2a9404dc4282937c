"""The history sink on both Delta engines: batches with a late older change, a delete, a re-insert, an
untracked change and a replayed batch id, read back with the engine's own reader; the history table's
change feed read as an export reads it."""

from __future__ import annotations

import json

import pyarrow as pa

from connectors.delta.change_feed import feed_schema, read_versions
from service.config.history import DELETED, END_AT, START_AT, UPDATED_AT, HistorySettings
from service.kafka_to_delta.sink.history_sink import HistorySink
from service.kafka_to_delta.source.history_rows import changelog_history
from tests.support.history_reference import reference

APP = "history-app"
# (id, sequence, delete?, a, b), per batch in delivery order (Kafka offsets follow the list).
BATCHES = [
    [(1, 10, False, "x", 0), (1, 30, False, "z", 0), (2, 5, False, "x", 1), (3, 7, False, "y", 0)],
    [(1, 20, False, "y", 0), (2, 8, True, None, 0), (1, 35, False, "z", 2), (3, 6, True, None, 0)],
    [(2, 9, False, "w", 1), (2, 9, False, "v", 1), (1, 36, True, None, 0)],
]


def changelog(batch: list[tuple], first_offset: int) -> pa.Table:
    """The typed row changes of the changelog rows a Debezium-shaped batch decodes to (one partition; a
    delete's key alone), as a range hands them over (`history_rows`)."""
    rows = []
    for n, (key, seq, deleted, a, b) in enumerate(batch):
        rows.append({"topic": "t", "partition": 0, "offset": first_offset + n, "timestamp": 0, "change_index": 0,
                     "kind": "-D" if deleted else "+U", "key": json.dumps([key]),
                     "row": None if deleted else json.dumps({"id": key, "a": a, "b": b}),
                     "types": json.dumps({"id": "int64", "a": "string", "b": "int64"}),
                     "unchanged": None, "sequence": json.dumps([seq]), "error": None})
    schema = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                        ("timestamp", pa.int64()),
                        ("change_index", pa.int32()), ("kind", pa.string()), ("key", pa.string()),
                        ("row", pa.string()), ("types", pa.string()), ("unchanged", pa.string()),
                        ("sequence", pa.string()),
                        ("error", pa.string())])
    return changelog_history(pa.Table.from_pylist(rows, schema), ("id",))[0]


def _rows(table: pa.Table) -> list[dict]:
    return sorted(table.select(["id", "a", "b", START_AT, END_AT, UPDATED_AT, DELETED]).to_pylist(),
                  key=lambda r: (r["id"], r[START_AT]))


def test_history_on_both_engines_equals_the_reference(engine, tmp_path):
    open_table, read_back = engine
    uri = str(tmp_path / "history")
    sink = HistorySink(open_table(uri), ("id",), HistorySettings(track_history_column_list=("a",)))
    offset = 0
    outcomes = []
    for batch_id, batch in enumerate(BATCHES):
        outcomes.append(sink.apply(changelog(batch, offset), APP, batch_id))
        offset += len(batch)
    version = sink.table.version()
    replay = sink.apply(changelog(BATCHES[1], len(BATCHES[0])), APP, 1)
    assert replay.skipped_replay and sink.table.version() == version
    assert not any(o.skipped_replay for o in outcomes)
    expected = reference([c for batch in BATCHES for c in batch], ("a",), False)
    assert _rows(read_back(uri)) == expected
    # the late update at 20 split the first version; the delete at 36 closed the version updated in place at 35
    assert [(r[START_AT], r[END_AT]) for r in expected if r["id"] == 1] == [(10, 20), (20, 30), (30, 36)]


def test_a_batch_the_history_holds_commits_nothing_and_the_feed_exports(engine, tmp_path):
    """The same changes under a new batch id change no row (no commit); the change feed of the history
    table is read as an export reads any table's."""
    open_table, _ = engine
    uri = str(tmp_path / "history")
    sink = HistorySink(open_table(uri), ("id",), HistorySettings(delete_markers=True))
    sink.apply(changelog(BATCHES[0], 0), APP, 0)
    version = sink.table.version()
    again = sink.apply(changelog(BATCHES[0], 0), APP, 1)
    assert (again.written, again.removed) == (0, 0) and sink.table.version() == version
    sink.apply(changelog(BATCHES[1], 4), APP, 2)
    feed = read_versions(uri, None, 0, sink.table.version(), feed_schema(sink.table.schema()))
    kinds = sorted(zip(feed.column("_change_type").to_pylist(), feed.column(START_AT).to_pylist()))
    # batch 2: the version of key 1 at 10 now ends at 20 (update), versions at 20 and 35 and markers at 8, 6
    assert ("insert", 20) in kinds and ("update_postimage", 10) in kinds and ("insert", 8) in kinds
