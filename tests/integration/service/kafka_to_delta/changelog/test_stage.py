"""FROM_CHANGELOG's stateful stage (spec 4.1.2.2): its processor under pyspark's TwsTester (no
Spark), then inside Spark with changelog rows streamed from parquet files (one file per
micro-batch). Input rows come from the real decoder, fed JSON records as Kafka would hold them."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import Row
from pyspark.sql.streaming.tws_tester import TwsTester

from connectors.kafka.range_reader import RAW_SCHEMA
from service.config.from_changelog import FromChangelogSettings
from service.config.settings import PipelineSettings
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder
from service.kafka_to_delta.changelog.stage import (
    GROUP,
    PASSTHROUGH_PREFIX,
    OrderAndUnzipConfig,
    OrderAndUnzipProcessor,
    stateful_changelog,
)
from service.kafka_to_delta.rows.arrow import CHANGELOG_SCHEMA
from service.kafka_to_delta.rows.spark import CHANGELOG_SPARK_SCHEMA
from tests.support.micro_batch_files import write_micro_batch_file

TOPIC = "cdc"
NAMES = CHANGELOG_SCHEMA.names
UPSERT_UNZIP = {"op_mapping": {"upsert": "INSERT, UPDATE_BEFORE, UPDATE_AFTER", "delete": "DELETE"}}
ORDERED = {"order_by": "event_time", "watermark_delay_seconds": 300}
NEVER_LATE = 2**62  # Spark does not filter late rows before this stage (it decides); nor may TwsTester


def ms(clock: str) -> int:
    """Epoch ms of a wall-clock time on 2024-01-01 ('14:03')."""
    hours, minutes = clock.split(":")
    return int(datetime(2024, 1, 1, int(hours), int(minutes), tzinfo=timezone.utc).timestamp() * 1000)


class FakeClock:
    def __init__(self, clock: str) -> None:
        self.set(clock)

    def set(self, clock: str) -> None:
        self.now = ms(clock) / 1000

    def __call__(self) -> float:
        return self.now


class Decoded:
    """JSON records -> changelog rows (CHANGELOG_SCHEMA dicts) through the real decoder, at
    increasing offsets of one topic partition."""

    def __init__(self, **params) -> None:
        self.settings = FromChangelogSettings(**params)
        self.decoder = ChangelogBatchDecoder(self.settings, ("id",))
        self.offset = 0

    def __call__(self, *values: dict | None, keys: list | None = None, timestamp_ms: int = 1_000) -> list[dict]:
        count = len(values)
        batch = pa.RecordBatch.from_pydict(
            {
                "key": keys or [None] * count,
                "value": [None if v is None else json.dumps(v).encode() for v in values],
                "topic": [TOPIC] * count, "partition": [0] * count,
                "offset": list(range(self.offset, self.offset + count)),
                "timestamp": [timestamp_ms * 1000] * count, "headers": [None] * count,
            },
            schema=RAW_SCHEMA,
        )
        self.offset += count
        return self.decoder(batch).to_pylist()


def timed(name: str, ident: int, clock: str, op: str = "INSERT") -> dict:
    return {"op": op, "id": ident, "name": name, "event_time": f"2024-01-01T{clock}:00Z"}


def group_of(row: dict) -> str:
    return f"{row['topic']}\u0000{row['partition_key']}"


def processor_under_test(decoded: Decoded, clock: FakeClock | None = None) -> TwsTester:
    config = OrderAndUnzipConfig.of(decoded.settings)
    processor = OrderAndUnzipProcessor(config, clock or FakeClock("00:00"))
    return TwsTester(processor, timeMode="EventTime", outputMode="Update", eventTimeExtractor=lambda _: NEVER_LATE)


def feed(tws: TwsTester, rows: list[dict]) -> list[dict]:
    """Each group's rows through the processor; the output rows as dicts."""
    out = []
    for group in dict.fromkeys(group_of(r) for r in rows):
        batch = [Row(**{**{n: r[n] for n in NAMES}, GROUP: group}) for r in rows if group_of(r) == group]
        out += [row.asDict() for row in tws.test(group, batch)]
    return out


def shown(rows: list[dict]) -> list[tuple]:
    return [(r["kind"], json.loads(r["row"])) for r in rows]


# ---- the processor alone ----------------------------------------------------------------------


@pytest.mark.parametrize(("late_handling", "handling"), [("drop", "SKIP"), ("dead_letter", "DEAD_LETTER")])
def test_4_1_2_2_1_ordering_with_watermarks_and_late_records(late_handling, handling):
    decoded = Decoded(**ORDERED, late_handling=late_handling)
    tws = processor_under_test(decoded)
    tws.setWatermark(ms("10:00"))
    assert feed(tws, decoded(timed("A", 6, "10:05"))) == []  # buffered until the watermark passes 10:05
    [late] = feed(tws, decoded(timed("B", 5, "09:55")))  # 09:55 < 10:00
    assert (late["error"], late["handling"], late["stage"]) == (
        "late record: event time 300000 ms behind the watermark", handling, "late"
    )
    assert (late["topic"], late["offset"], late["kind"], late["row"]) == (TOPIC, 1, None, None)
    assert feed(tws, decoded(timed("C", 7, "10:11"))) == []
    released = [row.asDict() for row in tws.setWatermark(ms("10:06"))]
    assert shown(released) == [("+I", {"id": 6, "name": "A", "event_time": "2024-01-01T10:05:00Z"})]
    assert tws.peekValueState("order", f"{TOPIC}\u0000[7]") is not None  # C stays buffered
    assert tws.peekValueState("order", f"{TOPIC}\u0000[6]") is None


def test_a_late_record_keeps_its_original_bytes_for_the_dead_letter_store():
    decoded = Decoded(**ORDERED, late_handling="dead_letter")
    tws = processor_under_test(decoded)
    tws.setWatermark(ms("10:00"))
    [row] = decoded(timed("B", 5, "09:55"), keys=[b'{"id": 5}'])
    original = json.dumps(timed("B", 5, "09:55")).encode()
    [late] = feed(tws, [{**row, "raw_key": b'{"id": 5}', "raw_value": original}])
    assert (late["raw_key"], late["raw_value"]) == (b'{"id": 5}', original)


def test_4_1_2_2_2_upsert_unzip_walkthrough_with_processing_time_ttl():
    clock = FakeClock("14:00")
    decoded = Decoded(state_ttl_seconds=300, **UPSERT_UNZIP)
    tws = processor_under_test(decoded, clock)
    group = f"{TOPIC}\u0000[99]"

    def image():
        stored = tws.peekValueState("image", group)
        return None if stored is None else json.loads(json.loads(stored[0])["row"])["name"]

    assert shown(feed(tws, decoded({"op": "upsert", "id": 99, "name": "Orphan"}))) == [
        ("+I", {"id": 99, "name": "Orphan"})
    ]
    assert image() == "Orphan"
    clock.set("14:03")
    assert shown(feed(tws, decoded({"op": "upsert", "id": 99, "name": "Orphan Updated"}))) == [
        ("-U", {"id": 99, "name": "Orphan"}), ("+U", {"id": 99, "name": "Orphan Updated"}),
    ]
    clock.set("14:05")
    assert shown(feed(tws, decoded({"op": "delete", "id": 99, "name": "Orphan Updated"}))) == [
        ("-D", {"id": 99, "name": "Orphan Updated"})
    ]
    assert image() is None  # CLEARED
    clock.set("14:10")
    assert shown(feed(tws, decoded({"op": "upsert", "id": 99, "name": "Resurrected"}))) == [
        ("+I", {"id": 99, "name": "Resurrected"})
    ]
    # 15:00: expired by processing time. The cleanup timer fires once the watermark moves on.
    clock.set("15:00")
    [armed] = tws.peekValueState("cleanup_at", group)
    assert tws.setWatermark(armed) == [] and image() is None
    assert tws.peekValueState("cleanup_at", group) is None


def test_a_live_image_survives_its_cleanup_timer_which_rearms():
    clock = FakeClock("14:00")
    decoded = Decoded(state_ttl_seconds=300, **UPSERT_UNZIP)
    tws = processor_under_test(decoded, clock)
    group = f"{TOPIC}\u0000[1]"
    tws.setWatermark(1_000)
    feed(tws, decoded({"op": "upsert", "id": 1, "name": "a"}))
    [armed] = tws.peekValueState("cleanup_at", group)
    assert armed == 1_000 + 300_000
    clock.set("14:04")
    tws.setWatermark(armed)  # event time ran ahead of the wall clock: one minute is left
    assert tws.peekValueState("image", group) is not None
    assert tws.peekValueState("cleanup_at", group) == (armed + 60_000,)
    clock.set("14:05")
    assert shown(feed(tws, decoded({"op": "upsert", "id": 1, "name": "b"}))) == [("+I", {"id": 1, "name": "b"})]


def test_4_1_2_2_3_watermarks_with_multiple_out_of_order_updates():
    decoded = Decoded(**ORDERED)
    tws = processor_under_test(decoded)
    latest = 0
    for record, watermark in [
        (timed("A", 5, "09:55"), "09:50"),
        (timed("Updated A", 5, "09:57", "UPDATE_AFTER"), "09:52"),
        (timed("Between updates A", 5, "09:56", "UPDATE_AFTER"), "09:52"),
    ]:
        assert feed(tws, decoded(record)) == []
        if ms(watermark) > latest:  # the spec's watermark stays at 09:52 once
            latest = ms(watermark)
            tws.setWatermark(latest)
    assert feed(tws, decoded(timed("B", 6, "10:20"))) == []
    emitted = [row.asDict() for row in tws.setWatermark(ms("10:15"))]
    assert [(r["kind"], json.loads(r["row"])["name"]) for r in emitted] == [("+I", "Updated A")]
    assert (emitted[0]["offset"], emitted[0]["change_index"]) == (1, 0)  # the position of 'Updated A'


def test_order_by_with_state_compacts_after_the_unzip():
    decoded = Decoded(**ORDERED, state_ttl_seconds=0, **UPSERT_UNZIP)
    tws = processor_under_test(decoded)
    feed(tws, decoded({"op": "upsert", "id": 1, "name": "a", "event_time": 1_000}))
    assert shown(tws.setWatermark(1_000)) == [("+I", {"id": 1, "name": "a", "event_time": 1_000})]
    later = [{"op": "upsert", "id": 1, "name": n, "event_time": t} for n, t in [("c", 3_000), ("b", 2_000)]]
    feed(tws, decoded(*later))
    out = [row.asDict() for row in tws.setWatermark(3_000)]
    assert [(r["kind"], json.loads(r["row"])["name"], r["offset"], r["change_index"]) for r in out] == [
        ("-U", "a", 1, 0), ("+U", "c", 1, 1),  # both at the position of the last change, in this order
    ]


def test_unzipped_rows_sort_in_emission_order():
    decoded = Decoded(state_ttl_seconds=0, **UPSERT_UNZIP)
    tws = processor_under_test(decoded)
    out = feed(tws, decoded(*[{"op": "upsert", "id": 1, "name": n} for n in "ab"]))
    assert [(r["kind"], r["offset"], r["change_index"]) for r in out] == [("+I", 0, 0), ("-U", 1, 0), ("+U", 1, 1)]
    retract = Decoded(before="before", after="after", op_mapping={"u": "UPDATE_BEFORE, UPDATE_AFTER"},
                      state_ttl_seconds=0)
    rows = retract({"op": "u", "before": {"id": 1, "v": 1}, "after": {"id": 1, "v": 2}})
    assert [(r["kind"], r["change_index"]) for r in feed(processor_under_test(retract), rows)] == [("-U", 0), ("+U", 4)]


def test_error_and_truncate_rows_pass_through_untouched():
    decoded = Decoded(preset="debezium", truncate_handling="truncate", state_ttl_seconds=0)
    tws = processor_under_test(decoded)
    error, truncate = decoded({"op": "x", "after": {"id": 1}}, {"op": "t", "source": {}})
    for row in (error, truncate):
        group = f"{PASSTHROUGH_PREFIX}{row['topic']}:{row['partition']}:{row['offset']}:0"
        [out] = tws.test(group, [Row(**{**row, GROUP: group})])
        assert out.asDict() == row


# ---- inside Spark -----------------------------------------------------------------------------


def pipeline(**from_changelog) -> PipelineSettings:
    return PipelineSettings(name="p", topics=[TOPIC], table="t", primary_key=["id"], from_changelog=from_changelog)


def write_batch(directory: Path, index: int, rows: list[dict]) -> None:
    """One parquet file per micro-batch, read in the order written."""
    full = [{name: row.get(name) for name in NAMES} for row in rows]
    write_micro_batch_file(directory, index, pa.Table.from_pylist(full, schema=CHANGELOG_SCHEMA))


class Collected:
    """The stage's output per micro-batch, from a streaming query over a directory of files."""

    def __init__(self, spark, workdir: Path, settings: PipelineSettings, **trigger) -> None:
        self.batches: dict[int, list[dict]] = {}
        self.arrived = threading.Condition()
        stream = spark.readStream.schema(CHANGELOG_SPARK_SCHEMA).option("maxFilesPerTrigger", 1).parquet(
            str(workdir / "in")
        )
        self.query = (
            stateful_changelog(stream, settings).writeStream.outputMode("update").foreachBatch(self._keep)
            .option("checkpointLocation", str(workdir / "ck")).trigger(**trigger).start()
        )

    def _keep(self, frame, batch_id: int) -> None:
        rows = [row.asDict() for row in frame.collect()]
        with self.arrived:
            self.batches[batch_id] = sorted(rows, key=lambda r: (r["offset"], r["change_index"]))
            self.arrived.notify_all()

    def wait_for(self, count: int, timeout: float = 300) -> list[dict]:
        """The rows of the first `count` batches that emitted something."""
        with self.arrived:
            assert self.arrived.wait_for(lambda: self._emitting() >= count, timeout), self.batches
            return [row for rows in self._nonempty()[:count] for row in rows]

    def _nonempty(self) -> list[list[dict]]:
        return [self.batches[b] for b in sorted(self.batches) if self.batches[b]]

    def _emitting(self) -> int:
        return len(self._nonempty())

    def finish(self) -> list[list[dict]]:
        self.query.awaitTermination(600)
        assert self.query.exception() is None
        return [self.batches[b] for b in sorted(self.batches)]


def test_spark_4_1_2_2_1_late_record_dropped_a_released_c_buffered(spark, workdir):
    decoded = Decoded(**ORDERED)
    for index, record in enumerate([timed("A", 6, "10:05"), timed("B", 5, "09:55"), timed("C", 7, "10:11")]):
        write_batch(workdir / "in", index, decoded(record))
    batches = Collected(spark, workdir, pipeline(**ORDERED), availableNow=True).finish()
    emitted = [row for rows in batches for row in rows]
    assert [(r["kind"], r["handling"], r["stage"], r["offset"]) for r in emitted if r["error"]] == [
        (None, "SKIP", "late", 1)
    ]
    changes = [r for r in emitted if not r["error"]]
    assert [(r["kind"], json.loads(r["row"])["name"]) for r in changes] == [("+I", "A")]  # C still buffered
    assert batches.index([r for r in batches if r and not r[0]["error"]][0]) == 3  # after C moved the watermark


def test_spark_4_1_2_2_3_out_of_order_updates_compact_to_the_final_state(spark, workdir):
    decoded = Decoded(**ORDERED)
    records = [timed("A", 5, "09:55"), timed("Updated A", 5, "09:57", "UPDATE_AFTER"),
               timed("Between updates A", 5, "09:56", "UPDATE_AFTER"), timed("B", 6, "10:20")]
    for index, record in enumerate(records):
        write_batch(workdir / "in", index, decoded(record))
    emitted = [row for rows in Collected(spark, workdir, pipeline(**ORDERED), availableNow=True).finish()
               for row in rows]
    assert [(r["kind"], json.loads(r["row"])["id"], json.loads(r["row"])["name"]) for r in emitted] == [
        ("+I", 5, "Updated A")
    ]


TTL_S = 8.0


def images(spark, checkpoint: Path) -> set[str]:
    """The groups holding a previous image, read from the checkpointed state store."""
    frame = spark.read.format("statestore").option("stateVarName", "image").load(str(checkpoint))
    return {row.key[GROUP] for row in frame.collect()}


def test_spark_4_1_2_2_2_upsert_unzip_with_a_real_state_ttl(spark, workdir):
    """TTL in data time (never the wall clock, so a replay decides the same): within it an upsert
    retracts the previous image; after it, it inserts, and the cleanup timer removes an image nobody
    touches again."""
    params = {"state_ttl_seconds": TTL_S, **UPSERT_UNZIP}
    decoded = Decoded(**params)
    now = int(time.time() * 1000)
    write_batch(workdir / "in", 0, decoded(
        {"op": "upsert", "id": 99, "name": "Orphan"}, {"op": "upsert", "id": 99, "name": "Orphan Updated"},
        {"op": "upsert", "id": 98, "name": "Untouched"}, timestamp_ms=now,
    ))
    collected = Collected(spark, workdir, pipeline(**params), processingTime="0.5 seconds")
    try:
        assert shown(collected.wait_for(1)) == [
            ("+I", {"id": 99, "name": "Orphan"}), ("-U", {"id": 99, "name": "Orphan"}),
            ("+U", {"id": 99, "name": "Orphan Updated"}), ("+I", {"id": 98, "name": "Untouched"}),
        ]
        write_batch(workdir / "in", 1, decoded(
            {"op": "delete", "id": 99, "name": "Orphan Updated"}, {"op": "upsert", "id": 99, "name": "Resurrected"},
            timestamp_ms=now,
        ))
        assert shown(collected.wait_for(2)[4:]) == [
            ("-D", {"id": 99, "name": "Orphan Updated"}), ("+I", {"id": 99, "name": "Resurrected"}),
        ]
        # TTL_S + 1 later in data time: 99 expired. The second record moves the watermark (Kafka time)
        # past 98's expiry but not past 99's new one: the cleanup timers remove 98's image only.
        again = decoded({"op": "upsert", "id": 99, "name": "Again"}, timestamp_ms=now + int((TTL_S + 1) * 1000))
        mover = decoded({"op": "upsert", "id": 97, "name": "Mover"}, timestamp_ms=now + int((TTL_S + 4) * 1000))
        write_batch(workdir / "in", 2, again + mover)
        assert shown(collected.wait_for(3)[6:]) == [
            ("+I", {"id": 99, "name": "Again"}), ("+I", {"id": 97, "name": "Mover"}),  # 99 expired: no -U
        ]
        deadline = time.monotonic() + 180
        while f"{TOPIC}\u0000[98]" in images(spark, workdir / "ck") and time.monotonic() < deadline:
            time.sleep(1)
        assert images(spark, workdir / "ck") == {f"{TOPIC}\u0000[99]", f"{TOPIC}\u0000[97]"}
    finally:
        collected.query.stop()
