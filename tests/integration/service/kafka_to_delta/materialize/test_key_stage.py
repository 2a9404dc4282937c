"""The materializer stage: its processor under pyspark's TwsTester (no Spark), then inside Spark
with changelog rows streamed from files (one file per micro-batch)."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pyarrow as pa
from pyspark.sql import Row
from pyspark.sql.streaming.tws_tester import TwsTester

from service.kafka_to_delta.materialize.bucket_stage import bucketed
from service.kafka_to_delta.materialize.bulk import DEFAULT_KEY_BUCKETS
from service.kafka_to_delta.materialize.key_stage import (
    MaterializerProcessor,
    StageConfig,
    materialize,
    time_mode,
    waiting_item,
)
from service.kafka_to_delta.materialize.net_changes import unpack_net
from service.kafka_to_delta.materialize.rules import MaterializerConfig
from service.kafka_to_delta.rows.arrow import CHANGELOG_SCHEMA
from service.kafka_to_delta.rows.names import BUCKET, error_group_key
from service.kafka_to_delta.rows.spark import CHANGELOG_SPARK_SCHEMA, NET_ARROW_SCHEMA, NET_SCHEMA
from tests.support.micro_batch_files import write_micro_batch_file

A1 = {"id": 1, "level": 10, "attr": "a1"}
B1 = {"id": 1, "level": 20, "attr": "b1"}
ORDERINGS = {
    "in order": [("+I", A1), ("-U", A1), ("+U", B1)],
    "add first": [("+U", B1), ("+I", A1), ("-U", A1)],
    "retract last": [("+I", A1), ("+U", B1), ("-U", A1)],
}
NEVER_LATE = 2**62  # the stage does not drop late rows; TwsTester would, unless told they are never late


def _text(row: dict) -> str:
    return orjson.dumps(row, option=orjson.OPT_SORT_KEYS).decode()


def change(kind: str, row: dict, offset: int, *, pk: str = "id", upsert_key: list | None = None,
           event_time: int = 5_000, partition: int = 0, topic: str = "t", timestamp: int | None = None) -> dict:
    """One CHANGELOG_SCHEMA row; the upsert key is the whole row unless `upsert_key` names columns."""
    key_text = _text([row[c] for c in upsert_key]) if upsert_key else _text(row)
    return {
        "topic": topic, "partition": partition, "offset": offset, "change_index": 0,
        "timestamp": 1_000 + offset if timestamp is None else timestamp, "kind": kind,
        "key": _text([row[pk]]), "upsert_key": key_text, "row": _text(row), "event_time": event_time,
    }


def _config(strategy: str, compaction: str = "batch", whole_row: bool = True, pk: str = "id") -> StageConfig:
    rules = MaterializerConfig(table="t1", primary_key=(pk,), on_conflict=strategy)
    return StageConfig(rules=rules, compaction=compaction, whole_row_key=whole_row)


# ---- the processor alone (TwsTester: one key at a time, watermark set by hand) ----


def _tester(config: StageConfig) -> TwsTester:
    mode = time_mode(config)
    extractor = (lambda _row: NEVER_LATE) if mode == "EventTime" else None
    return TwsTester(MaterializerProcessor(config), timeMode=mode, outputMode="Update", eventTimeExtractor=extractor)


def _rows(changes: list[dict]) -> list[Row]:
    return [Row(_group=c["key"], **{name: c.get(name) for name in CHANGELOG_SCHEMA.names}) for c in changes]


def test_watermark_keeps_changes_until_the_watermark_reaches_them_then_compacts_in_arrival_order():
    tester = _tester(_config("error", "watermark"))
    for offset, (kind, row) in enumerate(ORDERINGS["add first"]):
        assert tester.test("[1]", _rows([change(kind, row, offset)])) == []
    assert len(tester.peekListState("waiting", "[1]")) == 3
    assert tester.setWatermark(4_999) == []
    [net] = tester.setWatermark(5_000)
    assert (net.kind, json.loads(net.row), net.changes, net.conflicts) == ("+U", B1, 3, 0)
    assert tester.peekListState("waiting", "[1]") == []


def test_a_late_add_joins_the_waiting_retraction_no_false_conflict():
    """Email swap: -U(id2, b) waits; +U(id1, b) arrives behind the watermark: one barrier for both."""
    tester = _tester(_config("error", "watermark", whole_row=False, pk="email"))
    old2, new1 = {"id": 2, "email": "b"}, {"id": 1, "email": "b"}
    tester.setWatermark(5_000)
    live = {"v": 1, "l": [{"k": "[2]", "r": _text(old2), "p": ["t", 1, 0]}]}
    tester.updateValueState("rules", '["b"]', (json.dumps(live), None))
    retract = change("-U", old2, 5, pk="email", upsert_key=["id"], partition=1)
    tester.updateListState("waiting", '["b"]', [waiting_item(retract)])
    [net] = tester.test('["b"]', _rows([change("+U", new1, 3, pk="email", upsert_key=["id"])]))
    assert (net.kind, json.loads(net.row), net.changes, net.conflicts) == ("+U", new1, 2, 0)
    assert tester.peekListState("waiting", '["b"]') == []


def test_failed_rows_pass_through_under_a_key_of_their_own():
    tester = _tester(_config("error"))
    bad = {**change("+I", A1, 7), "kind": None, "row": None, "error": "bad record", "handling": "FAIL",
           "stage": "decode", "raw_value": b"\x00"}
    [out] = tester.test(error_group_key("t:0:7"), _rows([bad]))
    assert (out.error, out.offset, out.raw_value, out.kind) == ("bad record", 7, b"\x00", None)
    assert set(out.asDict()) == set(NET_SCHEMA.names)


def test_a_compaction_without_net_change_still_reports_its_changes():
    tester = _tester(_config("error"))
    [out] = tester.test("[1]", _rows([change("+I", A1, 0), change("-D", A1, 1)]))
    assert (out.kind, out.changes, out.state_bytes) == (None, 2, 0)


def test_state_ttl_drops_a_key_the_watermark_left_behind_by_more_than_the_ttl():
    rules = MaterializerConfig(table="t1", primary_key=("id",), on_conflict="error")
    tester = _tester(StageConfig(rules=rules, state_ttl_ms=10_000))
    row = {"id": 1, "v": 3}
    tester.test("[1]", _rows([change("+I", row, 0, upsert_key=["id"], event_time=5_000)]))
    tester.test("[1]", _rows([change("-U", row, 1, upsert_key=["id"], event_time=8_000),
                              change("+U", {**row, "v": 4}, 2, upsert_key=["id"], event_time=8_000)]))
    assert tester.peekValueState("rules", "[1]")[1] == 8_000
    tester.setWatermark(17_999)
    assert tester.peekValueState("rules", "[1]") is not None
    tester.setWatermark(18_000)
    assert tester.peekValueState("rules", "[1]") is None
    # After expiry a retraction finds nothing: logged and counted, never fatal.
    [out] = tester.test("[1]", _rows([change("-D", {**row, "v": 4}, 3, upsert_key=["id"], event_time=20_000)]))
    assert (out.kind, out.cleared_state_warnings) == (None, 1)


# ---- inside Spark ----


def _write(directory: Path, batches: list[list[dict]]) -> None:
    for index, rows in enumerate(batches):
        full = [{name: row.get(name) for name in CHANGELOG_SCHEMA.names} for row in rows]
        write_micro_batch_file(directory, index, pa.Table.from_pylist(full, schema=CHANGELOG_SCHEMA))


def _run(spark, workdir: Path, batches, config: StageConfig, delay_s: float = 0.0) -> tuple[dict, dict]:
    """The table the net changes make (key -> row), and the state operator's last progress."""
    _write(workdir / "in", batches)
    table: dict[str, dict] = {}

    def apply(df, _batch_id):
        for row in pa.Table.from_batches(list(unpack_net(df.toArrow().to_batches())), NET_ARROW_SCHEMA).to_pylist():
            if row["kind"] == "-D":
                table.pop(row["key"], None)
            elif row["kind"] == "+U":
                table[row["key"]] = json.loads(row["row"])

    stream = spark.readStream.schema(CHANGELOG_SPARK_SCHEMA).option("maxFilesPerTrigger", 1).parquet(
        str(workdir / "in")
    )
    query = (
        materialize(stream, config, delay_s).writeStream.outputMode("update").foreachBatch(apply)
        .option("checkpointLocation", str(workdir / "ck")).trigger(availableNow=True).start()
    )
    assert query.awaitTermination(600), "availableNow did not end"
    assert query.exception() is None
    [operator] = query.lastProgress["stateOperators"]
    return table, operator


def _ordering(name: str, key: int) -> list[tuple[str, dict]]:
    """One ordering of the join example for primary key `key` (the same rows otherwise)."""
    return [(kind, {**row, "id": key}) for kind, row in ORDERINGS[name]]


def test_join_example_in_one_micro_batch_all_orderings(spark, workdir):
    events = [event for key, name in enumerate(sorted(ORDERINGS), 1) for event in _ordering(name, key)]
    batch = [change(kind, row, i) for i, (kind, row) in enumerate(events)]
    table, operator = _run(spark, workdir, [batch], _config("error"))
    assert table == {f"[{key}]": {**B1, "id": key} for key in (1, 2, 3)}
    # Batch compaction keeps one state row per key bucket holding a live key, and nothing else.
    keys = spark.createDataFrame([(f"[{key}]",) for key in (1, 2, 3)], "_group string")
    buckets = bucketed(keys, DEFAULT_KEY_BUCKETS).select(BUCKET).distinct().count()
    assert operator["numRowsTotal"] == buckets and operator["memoryUsedBytes"] > 0


def test_join_example_over_separate_micro_batches_with_watermark_compaction(spark, workdir):
    events = [event for key, name in enumerate(sorted(ORDERINGS), 1) for event in _ordering(name, key)]
    batches = [[change(kind, row, i, partition=i % 4)] for i, (kind, row) in enumerate(events)]
    # Behind the watermark once the mover has passed: applied, not dropped.
    batches.append([change("+I", {"id": 4, "level": 1, "attr": "z"}, 20, event_time=60_000)])
    batches.append([change("+I", {"id": 5, "level": 1, "attr": "late"}, 21, event_time=6_000)])
    table, operator = _run(spark, workdir, batches, _config("error", "watermark"), delay_s=1.0)
    assert {k: table[k] for k in ("[1]", "[2]", "[3]")} == {f"[{key}]": {**B1, "id": key} for key in (1, 2, 3)}
    assert table["[5]"] == {"id": 5, "level": 1, "attr": "late"}
    assert operator["numRowsDroppedByWatermark"] == 0
