"""CPU of the materializer's bucket stage for whole micro-batches, outside Spark: the common keys decided
on the call's columns (`rules_columns`) against every key through the rules (`bulk.compact_many`).

`--batches` micro-batches of `--records` Connect JSON records of the realistic capture's shape
(`range_decode_benchmark.records`: bigint, numeric(12,2), timestamptz, date, jsonb, uuid, enum, text[],
a TOASTed text), decoded and packed per key bucket as the service does (`bucket_packing`), go through
`BucketProcessor` (pyspark's TwsTester keeps the state between them, so later batches find live rows),
with the table's primary key (the payload rows the driver receives). Both ways run in turns, `--rounds`
times; printed: the median CPU seconds of the steady batches (all but the first) and whether the two
ways' output and state are equal.

    .venv/bin/python bench/bucket_stage_calls.py [--records 10000] [--batches 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import pandas as pd
import pyarrow as pa
from pyspark.sql.streaming.tws_tester import TwsTester

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.range_decode_benchmark import _batches, records  # noqa: E402
from service.config.settings import PipelineSettings  # noqa: E402
from service.kafka_to_delta.materialize import bucket_stage  # noqa: E402
from service.kafka_to_delta.materialize.bucket_document import decode_bucket  # noqa: E402
from service.kafka_to_delta.materialize.bucket_stage import BucketProcessor  # noqa: E402
from service.kafka_to_delta.materialize.bulk import StageConfig  # noqa: E402
from service.kafka_to_delta.materialize.rules import MaterializerConfig  # noqa: E402
from service.kafka_to_delta.rows.ipc import table_records  # noqa: E402
from service.kafka_to_delta.rows.names import BUCKET, PACKED_CHANGES  # noqa: E402
from service.kafka_to_delta.source.batch_changes import batch_changes  # noqa: E402
from service.kafka_to_delta.source.bucket_packing import packed_buckets  # noqa: E402
from service.kafka_to_delta.source.decode_stage import DecodedRanges  # noqa: E402

BUCKETS = 16
PRIMARY_KEY = ("id",)


def packed_batches(count: int, batches: int) -> list[dict[int, list[bytes]]]:
    """Each micro-batch's packed changes per key bucket."""
    values = records(count * batches, False, False, False)
    decoded = DecodedRanges(PipelineSettings(name="p", topics=["t"], table="t", primary_key=list(PRIMARY_KEY)), None)
    out = []
    for at in range(batches):
        chunks = _batches(values[at * count:(at + 1) * count])
        by_bucket: dict[int, list[bytes]] = {}
        for packed in (packed_buckets(c, BUCKETS) for c in decoded(lambda: iter(chunks))):
            for bucket, blob in zip(packed.column(BUCKET).to_pylist(), packed.column(PACKED_CHANGES).to_pylist()):
                by_bucket.setdefault(bucket, []).append(blob)
        out.append(by_bucket)
    return out


def run(batches: list[dict[int, list[bytes]]]) -> tuple[list[float], list, dict]:
    """CPU seconds per micro-batch, the output rows and the final state of each bucket (its keys' states)."""
    rules = MaterializerConfig(table="t", primary_key=PRIMARY_KEY, on_conflict="error")
    config = StageConfig(rules=rules, key_buckets=BUCKETS, row_digests=True)
    tester = TwsTester(BucketProcessor(config, PRIMARY_KEY), timeMode="None", outputMode="Update")
    seconds, output = [], []
    for batch in batches:
        started = time.process_time()
        for bucket, blobs in sorted(batch.items()):
            output.append(tester.testInPandas(bucket, pd.DataFrame({PACKED_CHANGES: blobs})))
        seconds.append(time.process_time() - started)
    stored = {bucket: tester.peekValueState("keys", bucket) for bucket in range(BUCKETS)}
    states = {bucket: decode_bucket(None if value is None else value[0]) for bucket, value in stored.items()}
    return seconds, output, states


def _changes(output: list[pd.DataFrame]) -> list:
    """What the driver receives from each call (`batch_changes`), in key order."""
    out = []
    for frame in output:
        received = batch_changes(pa.Table.from_pandas(frame, preserve_index=False))
        out.append((sorted(received.changes.to_pylist(), key=str), received.count, received.counters))
    return out


def _rules_only(changes, states, row_digests):
    return None, table_records(changes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the first batch's deletes find no live row: one warning each
    batches = packed_batches(args.records, args.batches)
    steady: dict[str, list[float]] = {"columns": [], "rules": []}
    results = {}
    for _ in range(args.rounds):
        for way in steady:
            if way == "rules":
                with mock.patch.object(bucket_stage, "compact_columns", _rules_only):
                    seconds, output, states = run(batches)
            else:
                seconds, output, states = run(batches)
            steady[way].extend(seconds[1:])
            results[way] = (output, states)
    same = results["columns"][1] == results["rules"][1] and _changes(results["columns"][0]) == _changes(results["rules"][0])
    for way, seconds in steady.items():
        print(f"{way:8s} {statistics.median(seconds):.3f} s CPU per steady batch of {args.records:,} records "
              f"({len(seconds)} batches)")
    print(f"output and state equal: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
