"""A one-partition range reduced whole and in pieces, in process: what a cut costs and what it saves.

A range of `--events` Debezium envelopes of one partition (`DebeziumWorkload`, `--keys` keys, half with
the Connect schema block, or `--schema`) is reduced by the plain path's reducer (`PieceReducer`) whole
and as `--pieces` pieces, and the pieces' payloads are merged by the driver (`batch_changes`, with the
fill across pieces). Printed: CPU seconds (`time.process_time`) of the whole range and of each piece,
the longest piece (the wall a batch needs when every piece has its own core), the extra CPU of the cut,
and the driver merge of one payload against the pieces'. Best of `--repeat` runs each. The two results
are checked equal. Then the fill across pieces alone (`filled_last_rows`) on `--keys` keys whose last
change, in a second piece, left a column unchanged that the first piece holds (the workload has no
placeholders). CPU times, so a busy machine inflates them less than wall times; still say the load.

    .venv/bin/python bench/pieces_benchmark.py --events 100000 --keys 20000 --pieces 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from connectors.kafka.range_reader import SOURCE_SCHEMA  # noqa: E402
from service.config.settings import PipelineSettings  # noqa: E402
from service.kafka_to_delta.rows.names import Meta  # noqa: E402
from service.kafka_to_delta.source.batch_changes import batch_changes  # noqa: E402
from service.kafka_to_delta.source.decode_stage import batch_decoder  # noqa: E402
from service.kafka_to_delta.source.fill_across_ranges import filled_last_rows  # noqa: E402
from service.kafka_to_delta.source.piece_reducer import PieceReducer  # noqa: E402
from service.operations.workload import DebeziumWorkload  # noqa: E402

_CHUNK = 20_000


def _range(events: int, keys: int, schema: str) -> pa.Table:
    records = DebeziumWorkload("bench.pieces", 1, schema, seed=1).generate(events, keys)
    n = len(records)
    return pa.table({
        "key": [r.key for r in records], "value": [r.value for r in records], "topic": ["bench.pieces"] * n,
        "partition": pa.array([0] * n, pa.int32()), "offset": pa.array(range(n), pa.int64()),
        "timestamp": pa.array([1_700_000_000_000_000 + 1000 * i for i in range(n)], pa.timestamp("us", tz="UTC")),
        "headers": pa.nulls(n, SOURCE_SCHEMA.field("headers").type), "watermark_floor": pa.nulls(n, pa.int64()),
    }, schema=SOURCE_SCHEMA)


def _reduced(reducer: PieceReducer, records: pa.Table) -> tuple[float, pa.Table]:
    batches = records.to_batches(max_chunksize=_CHUNK)
    started = time.process_time()
    payloads = pa.Table.from_batches(list(reducer(lambda: iter(batches))))
    return time.process_time() - started, payloads


def _fill_seconds(keys: int, repeat: int) -> float:
    """CPU of filling every key's placeholder from an earlier piece (two pieces, one row a key each)."""
    def piece(index: int, placeholder: bool) -> pa.Table:
        return pa.table({
            "id": pa.array(range(keys), pa.int64()),
            "name": pa.array([None if placeholder else f"v{i}" for i in range(keys)], pa.string()),
            Meta.KEY: [f"[{i}]" for i in range(keys)], Meta.KIND: ["+U"] * keys, Meta.TOPIC: ["t"] * keys,
            Meta.PARTITION: pa.array([0] * keys, pa.int32()), Meta.OFFSET: pa.array(range(index * keys, (index + 1) * keys)),
            Meta.CHANGE_INDEX: pa.array([0] * keys, pa.int32()), Meta.TIMESTAMP: pa.array([0] * keys, pa.int64()),
            Meta.UNCHANGED: pa.array(['["name"]' if placeholder else None] * keys, pa.string()),
        })
    ordered = pa.concat_tables([piece(0, False), piece(1, True)]).sort_by([(c, "ascending") for c in Meta.ORDER])
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        filled = filled_last_rows(ordered)
        best = min(best, time.process_time() - started)
    assert filled.column(Meta.UNCHANGED).null_count == keys and filled.column("name").null_count == 0
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--pieces", type=int, default=2)
    parser.add_argument("--schema", choices=["always", "never", "mixed"], default="mixed")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    pipeline = PipelineSettings(name="p", topics=["bench.pieces"], table="t", primary_key=["id"])
    reducer = PieceReducer(batch_decoder(pipeline), ("id",))
    records = _range(args.events, args.keys, args.schema)
    n = records.num_rows
    bounds = [n * i // args.pieces for i in range(args.pieces + 1)]
    print(f"load at start: {os.getloadavg()[0]:.2f}; {n:,} records of one partition, {args.keys:,} keys, "
          f"{args.pieces} pieces")
    whole_s, piece_s, merge_whole_s, merge_pieces_s = [], [], [], []
    for _ in range(args.repeat):
        seconds, whole = _reduced(reducer, records)
        whole_s.append(seconds)
        runs = [_reduced(reducer, records.slice(a, b - a)) for a, b in zip(bounds, bounds[1:])]
        piece_s.append([seconds for seconds, _ in runs])
        started = time.process_time()
        one = batch_changes(whole)
        merge_whole_s.append(time.process_time() - started)
        started = time.process_time()
        cut = batch_changes(pa.concat_tables([payloads for _, payloads in runs]))
        merge_pieces_s.append(time.process_time() - started)
        ordered = [t.select(sorted(t.column_names)).sort_by("__cdc_key") for t in (one.changes, cut.changes)]
        assert ordered[0].equals(ordered[1]), "the pieces merged differently from the whole range"
    best = min(range(args.repeat), key=lambda i: max(piece_s[i]))
    print(f"whole range reduce CPU         {min(whole_s):6.2f} s  ({n / min(whole_s):,.0f} records/s on one core)")
    print(f"pieces reduce CPU, each        {', '.join(f'{s:.2f}' for s in piece_s[best])} s")
    print(f"longest piece (wall, a core each) {max(piece_s[best]):6.2f} s  "
          f"(the whole range takes {min(whole_s) / max(piece_s[best]):.2f}x as long)")
    print(f"extra CPU of the cut           {sum(piece_s[best]) - min(whole_s):+6.2f} s")
    print(f"driver merge: 1 payload {min(merge_whole_s) * 1000:.0f} ms, {args.pieces} pieces "
          f"{min(merge_pieces_s) * 1000:.0f} ms ({cut.changes.num_rows:,} keys)")
    print(f"fill across pieces, {args.keys:,} placeholders  {_fill_seconds(args.keys, args.repeat) * 1000:.0f} ms")
    print(f"load at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
