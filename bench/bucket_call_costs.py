"""What one call of the materializer's bucket stage costs in Python, outside Spark.

A bucket of `--keys` primary keys, each holding one live row (as the benchmark's Debezium tables do),
receives a micro-batch's changes for `--touched` of them (an update as a -U/+U pair, or an insert).
Printed, in milliseconds per call (best of `--repeat`):

- the state document: read, look up the touched keys, write back. The layout before this stop (one
  zstd-compressed JSON document: the whole bucket parsed into a dict and serialised again) against
  Arrow columns (`bucket_document`: only the touched keys become Python objects);
- the rules for the touched keys (`materializer_bulk.compact_many`): with the common case decided
  without the rules' objects (`materializer_fast`), and with every key through `Materializer.apply`.

    .venv/bin/python bench/bucket_call_costs.py
    .venv/bin/python bench/bucket_call_costs.py --keys 60000 --touched 6000
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Callable
from unittest import mock

import orjson
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.kafka_to_delta.materialize import bulk as materializer_bulk  # noqa: E402
from service.kafka_to_delta.materialize.bucket_document import (
    BucketDocument,
    StoredState,
)  # noqa: E402
from service.kafka_to_delta.materialize.bulk import compact_many  # noqa: E402
from service.kafka_to_delta.materialize.rules import Materializer, MaterializerConfig  # noqa: E402
from service.kafka_to_delta.rows.names import EVENT_TIME, GROUP  # noqa: E402

_ZSTD = pa.Codec("zstd", compression_level=1)


def _json_layout_cycle(blob: bytes, touched: list[str]) -> bytes:
    """The layout before: the whole bucket as one zstd-compressed JSON document."""
    document = _ZSTD.decompress(blob[9:], int.from_bytes(blob[1:9], "little"), asbytes=True)
    states = {key: (text, t) for key, (text, t) in orjson.loads(document).items()}
    for key in touched:
        states[key] = (states.get(key, ("", None))[0], None)
    plain = orjson.dumps(states)
    return b"\x01" + len(plain).to_bytes(8, "little") + _ZSTD.compress(plain, asbytes=True)


def _columns_cycle(blob: bytes, touched: list[str]) -> bytes:
    document = BucketDocument.read(blob)
    states = document.take(touched)
    document.replace(touched, states)
    return document.to_bytes()


def _record(key: int, kind: str, offset: int, rnd: random.Random) -> dict:
    row = orjson.dumps({"id": key, "name": f"n{rnd.randint(0, 10**6)}", "balance": rnd.random(), "active": True})
    text = f"[{key}]"
    return {GROUP: text, "kind": kind, "upsert_key": text, "row": row.decode(), "types": None, "unchanged": None,
            "sequence": None, EVENT_TIME: offset, "topic": "bench", "partition": key % 4, "offset": offset,
            "change_index": 0, "timestamp": offset}


def _best_ms(call: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        began = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - began)
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=6_250, help="primary keys stored in the bucket")
    parser.add_argument("--touched", type=int, default=600, help="keys the micro-batch changes")
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    rnd = random.Random(7)
    rules = Materializer(MaterializerConfig("bench", ("id",), "error"))
    states: dict[str, StoredState] = {}
    compact_many(rules, [_record(k, "+I", k, rnd) for k in range(args.keys)], states, False)
    keys = rnd.sample(range(args.keys), args.touched)
    batch: list[dict] = []
    for number, key in enumerate(keys):
        offset = args.keys + 2 * number
        batch += [_record(key, "-U", offset, rnd), _record(key, "+U", offset + 1, rnd)] if number % 5 else [
            _record(key, "+I", offset, rnd)]
    touched = [f"[{k}]" for k in keys]
    plain = orjson.dumps(states)
    json_blob = b"\x01" + len(plain).to_bytes(8, "little") + _ZSTD.compress(plain, asbytes=True)
    column_blob = BucketDocument.of_states(states).to_bytes()
    rows: list[tuple[str, float]] = [
        ("state document, one JSON document (before)", _best_ms(lambda: _json_layout_cycle(json_blob, touched),
                                                                args.repeat)),
        ("state document, Arrow columns", _best_ms(lambda: _columns_cycle(column_blob, touched), args.repeat)),
        ("rules, common case without the rules' objects",
         _best_ms(lambda: compact_many(rules, batch, {k: states[k] for k in touched}, False), args.repeat)),
    ]
    with mock.patch.object(materializer_bulk, "simple_outcome", lambda *_: None):
        rows.append(("rules, every key through Materializer.apply",
                     _best_ms(lambda: compact_many(rules, batch, {k: states[k] for k in touched}, False), args.repeat)))
    print(f"bucket of {args.keys:,} keys, {args.touched:,} touched ({len(batch):,} changes); "
          f"document {len(json_blob):,} bytes as JSON, {len(column_blob):,} as columns")
    for label, ms in rows:
        print(f"  {label:<50} {ms:7.2f} ms per call")


if __name__ == "__main__":
    main()
