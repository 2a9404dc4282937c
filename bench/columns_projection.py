"""Cost of a pipeline's `columns:` projection (filter, two computed columns, a masked column, an excluded
column; `sink.column_rules.ColumnRules.apply`) per micro-batch of typed net changes, on the driver's
local Spark, next to the size of the batch. Prints the best of five per batch size.

    .venv/bin/python bench/columns_projection.py [--rows 1000 10000 100000]
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
    args = parser.parse_args()
    os.environ[SALT_ENV] = "bench-salt"
    spark = build_spark(SparkSettings(master="local[2]", shuffle_partitions=2), engine="delta-rs")
    pipeline = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"], columns=COLUMNS)
    rules = ColumnRules(spark, pipeline, "t")
    for rows in args.rows:
        changes = batch(rows)
        rules.apply(changes, "bench")  # warm-up
        times = []
        for _ in range(5):
            started = time.perf_counter()
            out = rules.apply(changes, "bench")
            times.append(time.perf_counter() - started)
        kept = sum(1 for kind in out.column(Meta.KIND).to_pylist() if kind == "+U")
        print(f"{rows} net changes: projection {min(times) * 1000:.0f} ms (best of 5), "
              f"{rows / min(times):,.0f} rows/s; {kept} upserts kept")
    spark.stop()


if __name__ == "__main__":
    main()
