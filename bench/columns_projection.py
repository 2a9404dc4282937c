"""Cost of a pipeline's `columns:` projection (filter, two computed columns, a masked column, an excluded
column; `sink.column_rules.ColumnRules.apply`) per micro-batch of typed net changes, on the driver's
local Spark, next to the size of the batch. Prints the best of five per batch size, for the projection
read back from the planned local scan (`column_rules.collected`, no Spark job: what `apply` does) and,
with `--by-job`, for the same projection collected with `toArrow` (`collected_by_job`, a Spark job per
batch), alternating the two in each round so both see the same load.

    .venv/bin/python bench/columns_projection.py [--rows 1000 10000 100000] [--by-job]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
import pyarrow as pa

from service.config.settings import PipelineSettings, SparkSettings
from service.kafka_to_delta.rows.names import Meta
from service.kafka_to_delta.sink import column_rules
from service.kafka_to_delta.sink.column_rules import ColumnRules
from service.runtime.spark_session import build_spark

SALT_ENV = "BENCH_COLUMNS_SALT"
COLUMNS = {"exclude": ["notes"], "computed": {"domain": "split(email, '@')[1]", "big": "amount > 500"},
           "filter": "country = 'DE'", "mask": {"email": "sha256"}, "salt_env": SALT_ENV}


def batch(rows: int) -> pa.Table:
    """Typed net changes of `rows` keys: every third outside the filter, every tenth a delete."""
    ids = list(range(rows))
    table = pa.table({
        "id": pa.array(ids, pa.int64()), "email": [f"user{i}@example.org" for i in ids],
        "country": ["FR" if i % 3 == 0 else "DE" for i in ids], "amount": pa.array([i % 1000 for i in ids], pa.int64()),
        "notes": [f"note {i}" for i in ids],
        Meta.KEY: [json.dumps([i]) for i in ids], Meta.KIND: ["-D" if i % 10 == 0 else "+U" for i in ids],
        Meta.TOPIC: ["t"] * rows, Meta.PARTITION: pa.array([0] * rows, pa.int32()),
        Meta.OFFSET: pa.array(ids, pa.int64()), Meta.CHANGE_INDEX: pa.array([0] * rows, pa.int32()),
        Meta.TIMESTAMP: pa.array([0] * rows, pa.int64()), Meta.UNCHANGED: pa.nulls(rows, pa.string()),
    })
    return table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--by-job", action="store_true", help="also time the projection collected by a Spark job")
    args = parser.parse_args()
    os.environ[SALT_ENV] = "bench-salt"
    spark = build_spark(SparkSettings(master="local[2]", shuffle_partitions=2), engine="delta-rs")
    pipeline = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"], columns=COLUMNS)
    rules = ColumnRules(spark, pipeline, "t")
    ways = {"local scan": column_rules.collected}
    if args.by_job:
        ways["Spark job"] = column_rules.collected_by_job
    fast = column_rules.collected
    for rows in args.rows:
        changes = batch(rows)
        times: dict[str, list[float]] = {name: [] for name in ways}
        outs = {}
        for round_ in range(6):  # round 0 warms up
            for name, collect in ways.items():
                column_rules.collected = collect
                started = time.perf_counter()
                outs[name] = rules.apply(changes, "bench")
                if round_:
                    times[name].append(time.perf_counter() - started)
        column_rules.collected = fast
        if len({out.to_pylist().__repr__() for out in outs.values()}) != 1:
            raise SystemExit("FAILED: the two ways gave different rows")
        kept = sum(1 for kind in outs["local scan"].column(Meta.KIND).to_pylist() if kind == "+U")
        for name, taken in times.items():
            print(f"{rows} net changes, {name}: projection {min(taken) * 1000:.0f} ms (best of 5), "
                  f"{rows / min(taken):,.0f} rows/s; {kept} upserts kept")
    spark.stop()


if __name__ == "__main__":
    main()
