"""Net rows per second typed for the driver after the materializer (`payload.typed_changes`): in bulk
(`typed_rows.bulk_rows`: `pyarrow.json` and whole-column conversion) against the reference
(`loads` and `rows_to_table`, row by row), outside Spark.

The rows are the last change per key of `--records` Connect JSON records of the realistic capture's
shape (`range_decode_benchmark.records`: bigint, numeric(12,2), timestamptz, date, jsonb, uuid, enum,
text[], a 3 KB TOASTed text), with their schema blocks (`--schemas all`), without (`none`, as JSON without
schemas carries them: the column kinds are inferred from the values) or every other record without (`half`),
decoded by the stateful path's decoder and split into `--calls` sets
as the bucket stage's calls see them (one per key bucket). Printed: CPU rows/s of each way, the
median of `--rounds` rounds taken in turns, and whether the two tables are equal.

    .venv/bin/python bench/net_rows_typing.py [--records 10000] [--calls 16] [--rounds 7] [--schemas all|none|half]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.range_decode_benchmark import _batches, records  # noqa: E402
from service.config.settings import PipelineSettings  # noqa: E402
from service.kafka_to_delta.materialize.payload import (  # noqa: E402
    RETRACTIONS,
    _bulk_typed,
    _reference_typed,
)
from service.kafka_to_delta.rows.names import Column  # noqa: E402
from service.kafka_to_delta.source.decode_stage import batch_decoder  # noqa: E402

PRIMARY_KEY = ("id",)


def net_sets(count: int, calls: int, schemas: str = "all") -> list[pa.Table]:
    """The last change of each key, split by key into `calls` sets."""
    decoder = batch_decoder(PipelineSettings(name="p", topics=("t",), table="t", primary_key=PRIMARY_KEY))
    values = records(count, False, False, False)
    if schemas != "all":
        values = [json.dumps(json.loads(value)["payload"], separators=(",", ":")).encode()
                  if schemas == "none" or position % 2 else value for position, value in enumerate(values)]
    changes = pa.Table.from_batches([decoder(batch) for batch in _batches(values)])
    last: dict[str, int] = {}
    for position, key in enumerate(changes.column(Column.KEY).to_pylist()):
        last[key] = position
    net = changes.take(pa.array(sorted(last.values())))
    bucket = pc.remainder(pa.array(range(net.num_rows), pa.int64()), calls)
    return [net.filter(pc.equal(bucket, b)) for b in range(min(calls, net.num_rows))]


def _deletes(net: pa.Table) -> list[bool]:
    return pc.is_in(net.column(Column.KIND), pa.array(RETRACTIONS)).to_pylist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--schemas", choices=("all", "none", "half"), default="all")
    args = parser.parse_args()
    sets = net_sets(args.records, args.calls, schemas=args.schemas)
    rows = sum(s.num_rows for s in sets)
    ways = {
        "bulk": lambda net: _bulk_typed(net, PRIMARY_KEY, _deletes(net)),
        "reference": lambda net: _reference_typed(net, PRIMARY_KEY, _deletes(net)),
    }
    equal = all(ways["bulk"](s)[0].equals(ways["reference"](s)[0]) for s in sets)  # type: ignore[index]
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, way in ways.items():
            started = time.process_time()
            for net in sets:
                way(net)
            seconds[name].append(time.process_time() - started)
    print(f"{rows:,} net rows in {len(sets)} sets, tables equal: {equal}")
    for name, taken in seconds.items():
        print(f"  {name:9s} {rows / statistics.median(taken):>10,.0f} rows/s (CPU, median of {args.rounds})")


if __name__ == "__main__":
    main()
