"""The stateful paths' range decode (`decode_stage.DecodedRanges`): changelog rows, the watermark
candidates of each row, the per-partition event-time maxima, and the topic-scoped upsert keys."""

from __future__ import annotations

import json

import pyarrow as pa

from connectors.kafka.range_reader import SOURCE_SCHEMA
from service.config.settings import PipelineSettings
from service.kafka_to_delta.rows.names import WATERMARK_COLUMN, Column
from service.kafka_to_delta.rows.spark import STREAM_SPARK_SCHEMA
from service.kafka_to_delta.source.decode_stage import DecodedRanges, batch_decoder

_US = 1_000


def _records(topic: str, values: list[dict | None], first: int, floor: int | None = None) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_pydict({
        "key": [json.dumps({"id": v["after"]["id"] if v and v.get("after") else 0}).encode() for v in values],
        "value": [None if v is None else json.dumps(v).encode() for v in values], "topic": [topic] * n,
        "partition": pa.array([1] * n, pa.int32()), "offset": pa.array(range(first, first + n), pa.int64()),
        "timestamp": pa.array([(1_000 + 10 * i) * _US for i in range(first, first + n)], pa.timestamp("us", tz="UTC")),
        "headers": pa.nulls(n, SOURCE_SCHEMA.field("headers").type), "watermark_floor": pa.array([floor] * n, pa.int64()),
    }, schema=SOURCE_SCHEMA)


class _Maxima:
    def __init__(self) -> None:
        self.reported: list[dict] = []

    def report(self, maxima: dict) -> None:
        self.reported.append(dict(maxima))


def test_a_range_decodes_to_changelog_rows_with_running_watermark_candidates():
    pipeline = PipelineSettings(name="p", topics=["a", "b"], table="t", primary_key=["id"], on_conflict="error")
    values = [{"op": "c", "before": None, "after": {"id": i, "v": i}} for i in range(4)]
    batches = [_records("a", values[:2], 10), _records("a", values[2:], 12, floor=1_105)]
    maxima = _Maxima()
    out = pa.Table.from_batches(list(DecodedRanges(pipeline, maxima)(lambda: iter(batches))))  # type: ignore[arg-type]
    plain = pa.Table.from_batches([batch_decoder(pipeline)(b) for b in batches])
    assert out.column(Column.ROW).to_pylist() == plain.column(Column.ROW).to_pylist()
    assert out.column(Column.OFFSET).to_pylist() == [10, 11, 12, 13]
    # Several topics feed the table: each upsert key names its topic.
    assert out.column(Column.UPSERT_KEY).to_pylist() == [json.dumps(["a", [i]], separators=(",", ":")) for i in range(4)]
    # The running largest event time of the partition, held down by the range's floor where it has one.
    assert out.column(WATERMARK_COLUMN).to_pylist() == [1_100, 1_110, 1_105, 1_105]
    assert maxima.reported == [{("a", 1): 1_130}]
    assert STREAM_SPARK_SCHEMA.split(", ")[-1] == f"{WATERMARK_COLUMN} bigint"
