"""Engine conformance scenarios: the same actions through any `DeltaEngineTable`, observed
the same way (tables read back with delta-rs), so two engines can be compared.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
from deltalake import DeltaTable

from connectors.delta.engines import DeltaEngineTable
from connectors.delta.merge_plan import DELETE_FLAG, keep_flag
from service.kafka_to_delta.sink.merge_sink import MergeSink
from vocabulary.changes import ChangeKind

OpenEngine = Callable[[str], DeltaEngineTable]
APP = "cdc-lakehouse/test/engine"
KEY = ("te-nant", "id")
UNAVAILABLE = "__debezium_unavailable_value"
DATA = pa.schema([("te-nant", pa.string()), ("id", pa.int64()), ("name", pa.string()), ("odd-col.x", pa.string())])


def batch(rows: list[dict], deletes: list[bool], kept: list[bool] | None = None, email: list | None = None) -> pa.Table:
    """Net changes with the control columns: delete flag and a keep flag for `odd-col.x`."""
    columns = {f.name: pa.array([r.get(f.name) for r in rows], f.type) for f in DATA}
    if email is not None:
        columns["email"] = pa.array(email, pa.string())
    columns[DELETE_FLAG] = pa.array(deletes, pa.bool_())
    columns[keep_flag("odd-col.x")] = pa.array(kept or [False] * len(rows), pa.bool_())
    return pa.table(columns)


def _row(i: int, name: str, odd: str | None = None) -> dict:
    return {"te-nant": "t", "id": i, "name": name, "odd-col.x": odd}


FIRST = batch([_row(1, "a", "o1"), _row(2, "b", "o2")], deletes=[False, False])
SECOND = batch(
    [_row(1, "a2", UNAVAILABLE), {"te-nant": "t", "id": 2}, _row(3, "c", UNAVAILABLE)],  # unchanged TOAST: keep
    deletes=[False, True, False], kept=[True, False, True], email=["a@x", None, None],
)


def rows(uri: str) -> list[dict]:
    """The table's rows by id, read with delta-rs (one reader for every engine)."""
    return sorted(DeltaTable(uri).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])


def merge_evolve(open_engine: OpenEngine, root: Path) -> dict[str, Any]:
    """Create, then two MERGEs: delete, update keeping a TOAST column, insert, a new column."""
    table = open_engine(str(root / "t"))
    before = [table.schema(), table.version(), table.last_batch(APP)]
    table.create(DATA)
    table.merge(FIRST, KEY, APP, 0)
    table.merge(SECOND, KEY, APP, 1)
    schema = table.schema()
    return {
        "before": before, "rows": rows(table.uri), "columns": schema.names if schema else None,
        "last_batch": table.last_batch(APP),
        "cdf": DeltaTable(table.uri).metadata().configuration.get("delta.enableChangeDataFeed"),
    }


def merge_with_truncate(open_engine: OpenEngine, root: Path) -> dict[str, Any]:
    """MERGE with truncate: rows the batch does not match are deleted in the same commit."""
    table = open_engine(str(root / "t"))
    table.create(DATA)
    table.merge(FIRST, KEY, APP, 0)
    after_truncate = batch([_row(1, "a3", "o3"), {"te-nant": "t", "id": 4}, _row(5, "e")], [False, True, False])
    version = table.version()
    table.merge(after_truncate, KEY, APP, 1, truncate=True)
    one_commit = table.version() == (version or 0) + 1
    return {"rows": rows(table.uri), "one_commit": one_commit, "last_batch": table.last_batch(APP)}


def truncate(open_engine: OpenEngine, root: Path) -> dict[str, Any]:
    """truncate() empties the table under the batch's transaction; a missing table stays missing."""
    table = open_engine(str(root / "t"))
    table.create(DATA)
    table.merge(FIRST, KEY, APP, 0)
    table.truncate(APP, 1)
    missing = open_engine(str(root / "missing"))
    missing.truncate(APP, 1)
    return {"rows": rows(table.uri), "last_batch": table.last_batch(APP), "missing": missing.schema()}


def _net(changes: list[tuple[str, int, str | None]]) -> pa.Table:
    """Net changes as the pipeline hands them to the sink: key, kind, row, types."""
    return pa.table({
        "key": [json.dumps([i]) for _, i, _ in changes],
        "kind": [kind for kind, _, _ in changes],
        "row": [None if v is None else json.dumps({"id": i, "v": v}) for _, i, v in changes],
        "types": [json.dumps({"id": "int32", "v": "string"})] * len(changes),
    }, schema=pa.schema([("key", pa.string()), ("kind", pa.string()), ("row", pa.string()), ("types", pa.string())]))


def merge_sink_truncates(open_engine: OpenEngine, root: Path) -> dict[str, Any]:
    """The sink's two TRUNCATE paths: changes after it (MERGE with truncate), none (truncate())."""
    table = open_engine(str(root / "sink"))
    sink = MergeSink(table, ("id",))
    insert, update = ChangeKind.INSERT.value, ChangeKind.UPDATE_AFTER.value
    outcomes = [sink.apply(_net([(insert, 1, "a"), (insert, 2, "b")]), APP, 0)]
    outcomes.append(sink.apply(_net([(update, 2, "b2"), (insert, 3, "c")]), APP, 1, truncate=True))
    after_merge = [(r["id"], r["v"]) for r in rows(table.uri)]
    outcomes.append(sink.apply(_net([]), APP, 2, truncate=True))
    outcomes.append(sink.apply(_net([]), APP, 2, truncate=True))
    return {
        "after_merge": after_merge, "after_truncate": rows(table.uri), "last_batch": table.last_batch(APP),
        "outcomes": [[o.upserts, o.deletes, o.skipped_replay, o.truncated] for o in outcomes],
    }


SCENARIOS: dict[str, Callable[[OpenEngine, Path], dict[str, Any]]] = {
    f.__name__: f for f in (merge_evolve, merge_with_truncate, truncate, merge_sink_truncates)
}


def observe(scenario: str, open_engine: OpenEngine, root: Path) -> Any:
    """The scenario's observations as they read after a trip through JSON."""
    root.mkdir(parents=True, exist_ok=True)
    return json.loads(json.dumps(SCENARIOS[scenario](open_engine, root), default=str))


def change_feed(uri: str) -> list[list]:
    """(change type, id, name) of every change-feed row of the table, read by delta-rs."""
    feed = pa.table(DeltaTable(uri).load_cdf(starting_version=0))
    return sorted([r["_change_type"], r["id"], r["name"]] for r in feed.to_pylist())
