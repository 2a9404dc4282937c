"""Values per second of `bulk_values.bulk_column` against the reference `arrow_types.typed_column`,
per column type, on Debezium-shaped values (seeded).

Both sides start from the values of one NDJSON block: `bulk_column` from the column
`pyarrow.json` parsed (with `parse_type`), `typed_column` from the Python values `json.loads`
gave. The parse itself is timed apart (it is shared by every column of a record in the service).
Each figure is the best of `--repeats` runs.

    cd /work/main && nice -n 10 .venv/bin/python bench/bulk_values_benchmark.py [--values 200000]
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402
import pyarrow.json as pj  # noqa: E402

from connectors.delta.arrow_types import TypeName, typed_column  # noqa: E402
from service.kafka_to_delta.formats.bulk_values import bulk_column, parse_type  # noqa: E402

NULL_SHARE = 0.05
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _zoned(rng: random.Random) -> str:
    """Debezium's ZonedTimestamp text: fraction without trailing zeros, Z or an offset."""
    moment = EPOCH + timedelta(microseconds=rng.randrange(0, 60 * 365 * 86_400 * 10**6))
    offset = rng.choice([0, 0, 60, -300, 330])
    local = moment.astimezone(timezone(timedelta(minutes=offset)))
    text = local.strftime("%Y-%m-%dT%H:%M:%S")
    if local.microsecond:
        text += "." + f"{local.microsecond:06d}".rstrip("0")
    if offset == 0:
        return text + "Z"
    sign = "+" if offset > 0 else "-"
    return f"{text}{sign}{abs(offset) // 60:02d}:{abs(offset) % 60:02d}"


def _decimal(rng: random.Random, precision: int) -> str:
    unscaled = rng.randrange(-(10**precision) + 1, 10**precision)
    return base64.b64encode(unscaled.to_bytes(unscaled.bit_length() // 8 + 1, "big", signed=True)).decode()


GENERATORS: dict[str, Callable[[random.Random], object]] = {
    TypeName.INT32: lambda rng: rng.randrange(-(2**31), 2**31),
    TypeName.INT64: lambda rng: rng.randrange(-(2**63), 2**63),
    TypeName.FLOAT64: lambda rng: rng.uniform(-1e9, 1e9),
    TypeName.BOOL: lambda rng: rng.random() < 0.5,
    TypeName.STRING: lambda rng: f"customer-{rng.randrange(10**9)}@example.com",
    TypeName.BINARY: lambda rng: base64.b64encode(rng.randbytes(rng.randrange(1, 32))).decode(),
    "decimal(10,2)": lambda rng: _decimal(rng, 10),
    "decimal(38,10)": lambda rng: _decimal(rng, 38),
    "decimal(50,10)": lambda rng: _decimal(rng, 50),
    TypeName.DATE32: lambda rng: rng.randrange(-50_000, 50_000),
    TypeName.TIMESTAMP_MS: lambda rng: rng.randrange(0, 2_000_000_000_000),
    TypeName.TIMESTAMP_US: lambda rng: rng.randrange(0, 2_000_000_000_000_000),
    TypeName.TIMESTAMP_NS: lambda rng: rng.randrange(-(2**62), 2**62),
    TypeName.TIMESTAMP_US_UTC: _zoned,
}


def _best(repeats: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=27)
    args = parser.parse_args()
    print(f"{args.values:,} values per type, {NULL_SHARE:.0%} nulls, best of {args.repeats}")
    print(f"| type | bulk values/s | typed_column values/s | speed-up | pyarrow.json parse values/s | misfits |")
    print("|---|---:|---:|---:|---:|---:|")
    for type_name, generate in GENERATORS.items():
        rng = random.Random(f"{args.seed}-{type_name}")
        values = [None if rng.random() < NULL_SHARE else generate(rng) for _ in range(args.values)]
        text = "".join(json.dumps({"c": value}) + "\n" for value in values).encode()
        options = pj.ParseOptions(explicit_schema=pa.schema([("c", parse_type(type_name))]))

        def parse() -> pa.ChunkedArray:
            return pj.read_json(pa.py_buffer(text), parse_options=options).column("c")

        column = parse()
        python_values = [json.loads(line)["c"] for line in text.splitlines()]
        typed, misfit = bulk_column(column, type_name)
        reference = typed_column("c", type_name, python_values)
        if not typed.equals(reference):
            raise SystemExit(f"{type_name}: bulk and reference columns differ")
        bulk = _best(args.repeats, lambda: bulk_column(column, type_name))
        slow = _best(args.repeats, lambda: typed_column("c", type_name, python_values))
        parsing = _best(args.repeats, parse)
        print(f"| {type_name} | {args.values / bulk:,.0f} | {args.values / slow:,.0f} | {slow / bulk:,.1f}x "
              f"| {args.values / parsing:,.0f} | {int(misfit.sum())} |")


if __name__ == "__main__":
    main()
