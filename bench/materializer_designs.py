"""Materializer state designs, measured on the same changelog input inside Spark on this machine.

Every design applies the same pure rules (`service.kafka_to_delta.materialize.rules`, batch compaction,
on_conflict error) to the same micro-batches of changelog rows (CHANGELOG_SCHEMA, streamed from
Parquet files, one file per micro-batch, as tests/integration/service/kafka_to_delta/materialize/test_key_stage.py does),
and every design's net changes are applied to a dict that must equal the replay of the input:

- plain: no materializer, the per-batch reduction (`net_changes`), the reference the done-when
  figure is relative to;
- a-per-key: today's stage, row-based `transformWithState` grouped by primary key (value state
  per key);
- b-buckets-N: `transformWithStateInPandas` grouped by hash(key) % N, one value state per bucket
  (a JSON document of all its keys), the rules applied to the whole bucket in one call;
- b-apply-N: the same with `applyInPandasWithState` (GroupState holding the bucket document);
- c-delta-table: state as a Delta table (primary key, state, touched), read for the batch's keys
  and MERGEd back by delta-rs on the driver inside foreachBatch, with the batch id as the
  table's transaction version (what makes a replayed batch idempotent).

Per design: the time of each micro-batch (Spark's `triggerExecution`), steady events/s over
batches 1..N (batch 0 pays the Python worker start), and the state's bytes on disk at the end
(the checkpoint's state directory, or the state table).

    nice -n 10 .venv/bin/python bench/materializer_designs.py                # 50,000 changes, 5,000 and 50,000 keys
    nice -n 10 .venv/bin/python bench/materializer_designs.py --keys 5000 --designs plain,b-buckets-64
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator

import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.state import GroupState

from service.config.settings import SparkSettings
from service.kafka_to_delta.materialize.bucket_document import decode_bucket, encode_bucket
from service.kafka_to_delta.materialize.bucket_stage import GROUP_COLUMN, bucketed
from service.kafka_to_delta.materialize.bulk import arrival, compact_many
from service.kafka_to_delta.materialize.key_stage import StageConfig, grouped_changes, materialize
from service.kafka_to_delta.materialize.net_changes import net_changes, pack_net, unpack_net
from service.kafka_to_delta.materialize.rules import Materializer, MaterializerConfig
from service.kafka_to_delta.rows.arrow import CHANGELOG_SCHEMA
from service.kafka_to_delta.rows.names import BUCKET, GROUP, PACKED_COLUMN, PACKED_NET_SPARK_SCHEMA
from service.kafka_to_delta.rows.spark import CHANGELOG_SPARK_SCHEMA, NET_ARROW_SCHEMA
from service.runtime.spark_session import build_spark

CONFIG = StageConfig(rules=MaterializerConfig(table="bench", primary_key=("id",), on_conflict="error"), key_buckets=0)
_CARRIED = [GROUP, "kind", "upsert_key", "row", "types", "unchanged", "sequence", "event_time", "topic", "partition",
            "offset", "change_index", "timestamp", "key", "error", "handling", "stage", "raw_key", "raw_value",
            "headers"]
_STATE_TABLE_SCHEMA = pa.schema([("pk", pa.string()), ("state", pa.string()), ("touched", pa.int64()),
                                 ("gone", pa.bool_())])


# ---- the input ----


def _text(value) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def changelog_batches(events: int, keys: int, batch_rows: int, seed: int = 7) -> tuple[list[list[dict]], dict]:
    """Micro-batches of about `batch_rows` changelog rows over `keys` primary keys, and the replayed table.

    A change picks a key at random: insert if the key is not live, else an update (-U, +U of one
    record) or, one time in eight, a delete.
    """
    rng, live, batches, batch, offset, made = random.Random(seed), {}, [], [], 0, 0
    while made < events:
        key = rng.randrange(keys)
        pk = _text([key])
        row = _text({"id": key, "name": f"user-{key}-{rng.randrange(10**6)}", "email": f"u{key}.{offset}@example.com",
                     "balance": round(rng.uniform(-1e4, 1e4), 2), "active": rng.random() < 0.5})
        old = live.get(pk)
        if old is None:
            kinds = [("+I", row)]
            live[pk] = row
        elif rng.random() < 0.125:
            kinds = [("-D", old)]
            del live[pk]
        else:
            kinds = [("-U", old), ("+U", row)]
            live[pk] = row
        for index, (kind, text) in enumerate(kinds):
            batch.append({"topic": "t", "partition": key % 4, "offset": offset, "change_index": index,
                          "timestamp": 1_000 + offset, "kind": kind, "key": pk, "upsert_key": pk, "row": text,
                          "event_time": 1_000 + offset})
        offset, made = offset + 1, made + len(kinds)
        if len(batch) >= batch_rows:
            batches.append(batch)
            batch = []
    if batch:
        batches.append(batch)
    return batches, {k: orjson.loads(v) for k, v in live.items()}


def write_batches(directory: Path, batches: list[list[dict]]) -> None:
    """One Parquet file per micro-batch."""
    directory.mkdir(parents=True)
    for index, rows in enumerate(batches):
        full = [{name: row.get(name) for name in CHANGELOG_SCHEMA.names} for row in rows]
        pq.write_table(pa.Table.from_pylist(full, schema=CHANGELOG_SCHEMA), directory / f"{index:04d}.parquet")


# ---- the designs: a streaming changelog -> net changes (NET_SCHEMA), and how the state is found ----


def per_key(stream: DataFrame, _work: Path) -> DataFrame:
    """(a) today's stage."""
    return materialize(stream, CONFIG)


def plain(stream: DataFrame, _work: Path) -> DataFrame:
    """The per-batch reduction without materializer."""
    return net_changes(stream)


def buckets_tws(count: int) -> Callable[[DataFrame, Path], DataFrame]:
    """(b) the stage with state per key bucket (transformWithStateInPandas over hash(key) % count)."""
    def plan(stream: DataFrame, _work: Path) -> DataFrame:
        return materialize(stream, replace(CONFIG, key_buckets=count))
    return plan


def _apply_bucket(key: tuple, frames: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
    records = [r for frame in frames for r in pa.Table.from_pandas(frame, preserve_index=False).to_pylist()]
    for record in records:
        record[GROUP] = record.pop(GROUP_COLUMN)
    states = decode_bucket(state.get[0] if state.exists else None)
    out = compact_many(Materializer(CONFIG.rules), sorted(records, key=arrival), states, whole_row_key=False)
    if states:
        state.update((encode_bucket(states),))
    elif state.exists:
        state.remove()
    if out:
        yield pd.DataFrame({PACKED_COLUMN: [pack_net(out)]})


def buckets_apply(count: int) -> Callable[[DataFrame, Path], DataFrame]:
    """(b') applyInPandasWithState over key buckets."""
    def plan(stream: DataFrame, _work: Path) -> DataFrame:
        grouped = bucketed(grouped_changes(stream), count).select(GROUP_COLUMN, *_CARRIED[1:], BUCKET)
        return grouped.groupBy(BUCKET).applyInPandasWithState(
            _apply_bucket, PACKED_NET_SPARK_SCHEMA, "keys binary", "Update", "NoTimeout")
    return plan


class DeltaState:
    """(c) the state as a Delta table, joined per batch on the driver."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.rules = Materializer(CONFIG.rules)
        write_deltalake(self.path, _STATE_TABLE_SCHEMA.empty_table())

    def materialize(self, records: list[dict], batch_id: int) -> list[dict]:
        """Net rows of one micro-batch; the state table moves to this batch's version in one commit."""
        table = DeltaTable(self.path)
        app = next((t for t in [table.transaction_version("materializer")] if t is not None), -1)
        if batch_id <= app:
            raise RuntimeError("replayed batch: read the state as of the version before it (time travel)")
        keys = pa.array(sorted({r[GROUP] for r in records}), pa.string())
        known = table.to_pyarrow_dataset().to_table(filter=pc.field("pk").isin(keys), columns=["pk", "state", "touched"])
        states = {pk: (state, touched) for pk, state, touched in zip(*(known.column(n).to_pylist() for n in
                                                                        ("pk", "state", "touched")))}
        out = compact_many(self.rules, sorted(records, key=arrival), states, whole_row_key=False)
        changed = pa.table({"pk": keys, "state": [states.get(k, (None,))[0] for k in keys.to_pylist()],
                            "touched": pa.array([states.get(k, (None, None))[1] for k in keys.to_pylist()], pa.int64()),
                            "gone": [k not in states for k in keys.to_pylist()]}, schema=_STATE_TABLE_SCHEMA)
        commit = CommitProperties(app_transactions=[Transaction("materializer", batch_id)])
        (table.merge(changed, "t.pk = s.pk", source_alias="s", target_alias="t", commit_properties=commit)
         .when_matched_delete("s.gone").when_matched_update_all("NOT s.gone")
         .when_not_matched_insert_all("NOT s.gone").execute())
        return out


# ---- running one design ----


def _apply(table: dict, rows: list[dict]) -> None:
    for row in rows:
        if row["kind"] == "-D":
            table.pop(row["key"], None)
        elif row["kind"] == "+U":
            table[row["key"]] = orjson.loads(row["row"])


def _du(path: Path) -> int:
    if not path.exists():
        return 0
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def run_design(spark: SparkSession, name: str, inputs: Path, work: Path) -> dict:
    """Stream the input through one design; per-batch seconds, state bytes and the resulting table."""
    table: dict = {}
    stream = spark.readStream.schema(CHANGELOG_SPARK_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(inputs))
    if name == "c-delta-table":
        state = DeltaState(work / "state_table")

        def sink(df: DataFrame, batch_id: int) -> None:
            records = grouped_changes(df).select(*_CARRIED).toArrow().to_pylist()
            _apply(table, state.materialize(records, batch_id))
        out, state_dir = stream, work / "state_table"
    else:
        out, state_dir = DESIGNS[name](stream, work), work / "ck" / "state"

        def sink(df: DataFrame, _batch_id: int) -> None:
            arrow = df.toArrow()
            if PACKED_COLUMN in arrow.column_names:  # the bucket stages pack their net rows
                arrow = pa.Table.from_batches(list(unpack_net(arrow.to_batches())), NET_ARROW_SCHEMA)
            _apply(table, arrow.select(["key", "kind", "row"]).to_pylist())
    started = time.monotonic()
    query = (out.writeStream.outputMode("update").foreachBatch(sink).option("checkpointLocation", str(work / "ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"{name}: {query.exception()}")
    wall = time.monotonic() - started
    seconds = [p["durationMs"]["triggerExecution"] / 1000 for p in query.recentProgress if p["numInputRows"]]
    rows = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    return {"seconds": seconds, "rows": rows, "wall": wall, "state_bytes": _du(state_dir), "table": table}


DESIGNS: dict[str, Callable[[DataFrame, Path], DataFrame]] = {
    "plain": plain,
    "a-per-key": per_key,
    **{f"b-buckets-{n}": buckets_tws(n) for n in (16, 64, 256)},
    **{f"b-apply-{n}": buckets_apply(n) for n in (16, 64)},
    "c-delta-table": lambda stream, _work: stream,
}


def report(keys: int, results: dict[str, dict]) -> None:
    """One table per key count."""
    base = results.get("plain")
    base_rate = sum(base["rows"][1:]) / sum(base["seconds"][1:]) if base and len(base["rows"]) > 1 else None
    print(f"\n{keys:,} keys: steady = batches 1..N (batch 0 pays worker start)")
    print(f"| design | batch 0 s | steady s/batch (min-max) | steady changes/s | x plain | state bytes on disk |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        steady = r["seconds"][1:] or r["seconds"]
        rate = sum(r["rows"][1:] or r["rows"]) / sum(steady)
        ratio = f"{rate / base_rate:.2f}" if base_rate else "-"
        print(f"| {name} | {r['seconds'][0]:.2f} | {sum(steady) / len(steady):.2f} ({min(steady):.2f}-{max(steady):.2f}) "
              f"| {rate:,.0f} | {ratio} | {r['state_bytes']:,} |")


def main(argv: list[str] | None = None) -> None:
    """Run every design on every key count."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=50_000, help="changelog rows")
    parser.add_argument("--keys", default="5000,50000", help="primary key counts, comma separated")
    parser.add_argument("--batch-rows", type=int, default=10_000)
    parser.add_argument("--designs", default=",".join(DESIGNS), help=f"comma separated, of {', '.join(DESIGNS)}")
    parser.add_argument("--shuffle-partitions", type=int, default=4)
    args = parser.parse_args(argv)
    spark = build_spark(SparkSettings(master="local[2]", shuffle_partitions=args.shuffle_partitions))
    print(f"load before: {Path('/proc/loadavg').read_text().split()[:3]}")
    for keys in (int(k) for k in args.keys.split(",")):
        batches, expected = changelog_batches(args.events, keys, args.batch_rows)
        results: dict[str, dict] = {}
        with tempfile.TemporaryDirectory(prefix="mat-designs-") as tmp:
            write_batches(Path(tmp) / "in", batches)
            for name in args.designs.split(","):
                work = Path(tmp) / name
                result = run_design(spark, name, Path(tmp) / "in", work)
                if result["table"] != expected:
                    raise AssertionError(f"{name}: the table differs from the replay")
                results[name] = result
                print(f"  {keys} keys, {name}: " + json.dumps({k: v for k, v in result.items() if k != "table"},
                                                             default=lambda x: round(x, 2)), flush=True)
        report(keys, results)
    print(f"load after: {Path('/proc/loadavg').read_text().split()[:3]}")


if __name__ == "__main__":
    main()
