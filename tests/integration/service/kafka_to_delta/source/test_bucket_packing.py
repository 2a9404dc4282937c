"""Changes packed per key bucket inside Spark: the bucket is Spark's own hash, and the materializer
makes the same table from packed changes as from one row per change, also when a checkpoint
written from rows goes on from packed changes (the service's upgrade)."""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

import pyarrow as pa
from pyspark.sql import functions as F

from service.kafka_to_delta.materialize.bulk import (
    DEFAULT_KEY_BUCKETS,
    LEGACY_KEY_BUCKETS,
    StageConfig,
)
from service.kafka_to_delta.materialize.key_stage import materialize
from service.kafka_to_delta.materialize.net_changes import unpack_net
from service.kafka_to_delta.materialize.rules import MaterializerConfig
from service.kafka_to_delta.rows.arrow import CHANGELOG_SCHEMA
from service.kafka_to_delta.rows.names import PACKED_SPARK_SCHEMA, WATERMARK_COLUMN
from service.kafka_to_delta.rows.spark import CHANGELOG_SPARK_SCHEMA, NET_ARROW_SCHEMA
from service.kafka_to_delta.source.bucket_packing import packed_buckets, spark_bucket
from tests.integration.service.kafka_to_delta.materialize.test_key_stage import change
from tests.support.micro_batch_files import write_micro_batch_file

SEEDS = [3]


def test_spark_bucket_is_sparks_pmod_of_xxhash64(spark):
    rnd = random.Random(11)
    alphabet = string.printable + "éß中😀"
    texts = [json.dumps([rnd.randrange(10**9)]) for _ in range(2_000)]
    texts += ["".join(rnd.choice(alphabet) for _ in range(rnd.randrange(0, 90))) for _ in range(2_000)]
    frame = spark.createDataFrame([(t,) for t in texts] + [(None,)], "g string")
    for buckets in (DEFAULT_KEY_BUCKETS, LEGACY_KEY_BUCKETS, 7):
        spark_side = [r[0] for r in frame.select(F.pmod(F.xxhash64("g"), F.lit(buckets))).collect()]
        assert spark_side == [spark_bucket(t, buckets) for t in [*texts, None]], buckets


def _workload(seed: int, batches: int = 4, keys: int = 40) -> tuple[list[list[dict]], dict[str, dict]]:
    """Debezium-like changes over `keys` primary keys in three partitions, and the table they make."""
    rnd = random.Random(seed)
    current: dict[int, dict] = {}
    offsets = [0, 0, 0]
    out = []
    for _ in range(batches):
        batch = []
        for _ in range(rnd.randrange(5, 60)):
            key = rnd.randrange(keys)
            partition, old = key % 3, current.get(key)
            new = {"id": key, "v": rnd.randrange(1_000)}
            if old is None:
                events = [("+I", new)]
            elif rnd.random() < 0.2:
                events, new = [("-D", old)], None
            else:
                events = [("-U", old), ("+U", new)]
            moment = 1_000 + sum(offsets)
            for index, (kind, row) in enumerate(events):
                batch.append({**change(kind, row, offsets[partition], upsert_key=["id"], partition=partition,
                                       event_time=moment, timestamp=moment), "change_index": index})
            offsets[partition] += 1
            if new is None:
                current.pop(key)
            else:
                current[key] = new
        out.append(batch)
    return out, {f"[{key}]": row for key, row in current.items()}


def _rows_batch(changes: list[dict]) -> pa.RecordBatch:
    full = [{name: c.get(name) for name in CHANGELOG_SCHEMA.names} for c in changes]
    rows = pa.RecordBatch.from_pylist(full, schema=CHANGELOG_SCHEMA)
    return rows.append_column(WATERMARK_COLUMN, rows.column("event_time"))


def _write(directory: Path, batches: list[list[dict]], packed: bool, first: int,
           labels: tuple[int, ...] | None = None) -> None:
    for index, changes in enumerate(batches, first):
        rows = _rows_batch(changes)
        table = pa.Table.from_batches([packed_buckets(rows, DEFAULT_KEY_BUCKETS, labels) if packed else rows.drop_columns(
            [WATERMARK_COLUMN])])
        write_micro_batch_file(directory, index, table)


def _run(spark, source: Path, packed: bool, checkpoint: Path, table: dict[str, dict], config: StageConfig) -> None:
    warnings: list[int] = []

    def apply(df, _batch_id):
        for row in pa.Table.from_batches(list(unpack_net(df.toArrow().to_batches())), NET_ARROW_SCHEMA).to_pylist():
            # A change that finds no state where its key's state should be is counted here.
            warnings.append(row["cleared_state_warnings"] + row["conflicts"] + row["rollbacks"])
            if row["kind"] == "-D":
                table.pop(row["key"], None)
            elif row["kind"] == "+U":
                table[row["key"]] = json.loads(row["row"])

    schema = PACKED_SPARK_SCHEMA if packed else CHANGELOG_SPARK_SCHEMA
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(source))
    query = (
        materialize(stream, config, 0.0).writeStream.outputMode("update").foreachBatch(apply)
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    )
    assert query.awaitTermination(600), "availableNow did not end"
    assert query.exception() is None
    assert warnings and not any(warnings), "a change did not find its key's state"


def test_packed_changes_make_the_table_rows_make_also_after_an_upgrade(spark, workdir):
    rules = MaterializerConfig(table="t", primary_key=("id",), on_conflict="error")
    # Spread: the buckets under their labels (`bucket_labels`), packed in Python and bucketed by Spark alike.
    configs = {"batch": StageConfig(rules=rules), "watermark": StageConfig(rules, "watermark", state_ttl_ms=10**9),
               "spread": StageConfig(rules=rules, spread_buckets=True)}
    for seed in SEEDS:
        batches, expected = _workload(seed)
        half = len(batches) // 2
        base = workdir / str(seed)
        _write(base / "rows", batches, packed=False, first=0)
        for compaction, config in configs.items():
            tables: dict[str, dict] = {"rows": {}, "packed": {}, "upgrade": {}}
            _write(base / f"packed-{compaction}", batches, packed=True, first=0, labels=config.bucket_labels)
            for name in ("rows", f"packed-{compaction}"):
                _run(spark, base / name, name != "rows", base / f"ck-{compaction}-{name}",
                     tables["rows" if name == "rows" else "packed"], config)
            # A file source stays on its directory: the packed files join the rows the first run read.
            upgrade = base / f"upgrade-{compaction}"
            _write(upgrade, batches[:half], packed=False, first=0)
            _run(spark, upgrade, False, base / f"ck-{compaction}-upgrade", tables["upgrade"], config)
            _write(upgrade, batches[half:], packed=True, first=half, labels=config.bucket_labels)
            _run(spark, upgrade, True, base / f"ck-{compaction}-upgrade", tables["upgrade"], config)
            # Batch compaction applies each micro-batch at once; under the watermark the last changes
            # still wait, the same ones whatever the input's form.
            if compaction != "watermark":
                assert tables["rows"] == expected, seed
            assert tables["packed"] == tables["rows"] and tables["upgrade"] == tables["rows"], (seed, compaction)
            assert tables["rows"], seed
