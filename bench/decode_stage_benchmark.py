"""The bucket stage's decode: record by record (`ChangelogBatchDecoder`) against the bulk way
(`changelog_columns.BulkChangelog`), CPU per batch of `--records`, without Spark or a broker.

Inputs: Confluent Avro through the in-process registry double, `bench.avro_decode_benchmark`'s orders
envelopes, clean and with one damaged record (a union index out of its union); and a capture's shape as
Avro (bigint, numeric(12,2), timestamptz, date, jsonb, uuid, enum, text[] and a TOASTed text, half the
updates with its placeholder: the Kafka Connect records of `range_decode_benchmark` converted as Kafka
Connect's Avro converter writes them). The JSON capture shape goes record by record on both ways (the bulk
way takes Avro only, docs/design/materializer-state.md): its row shows the reference's cost. Each way is
timed `--rounds` times in turns (median); the rows of the two ways are compared (every column the bucket
stage reads).

    .venv/bin/python -m bench.decode_stage_benchmark [--records 10000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import orjson
import pyarrow as pa

from bench.range_decode_benchmark import _avro_records, _batches, records
from connectors.schema_registry.avro_codec import ConfluentAvroDecoder
from connectors.schema_registry.client import SchemaRegistryClient
from service.config.settings import PipelineSettings
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder
from service.kafka_to_delta.source.changelog_columns import BulkChangelog
from service.kafka_to_delta.source.decode_stage import batch_decoder
from testbed.connect_avro import ConnectAvroConverter
from tests.support.schema_registry_double import SchemaRegistryDouble

_PIPELINE = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"])


def _seconds(decode, batches: list[pa.RecordBatch]) -> tuple[float, pa.Table]:
    started = time.process_time()
    out = [decode(batch) for batch in batches]
    return time.process_time() - started, pa.Table.from_batches(out)


def _row(name: str, decoder: ChangelogBatchDecoder, values: list[bytes], rounds: int) -> None:
    batches = _batches(values)
    bulk = BulkChangelog(decoder, ("id",))
    exact_s, fast_s, how = [], [], "record by record"
    for _ in range(rounds):
        seconds, exact = _seconds(decoder, batches)
        exact_s.append(seconds)
        decode = bulk.range_decoder()
        seconds, fast = _seconds(decode, batches)
        fast_s.append(seconds)
        if decode.bulk:
            how = f"in bulk ({decode.bulk} of {len(batches)} batches)"
        if decode.fallback:
            how += f", then record by record: {decode.fallback}"
    names = [n for n in exact.column_names if n != "snapshot"]
    same = "yes" if exact.select(names).equals(fast.select(names)) else "NO"
    exact_m, fast_m = statistics.median(exact_s), statistics.median(fast_s)
    print(f"| {name} | {exact_m:.3f} | {fast_m:.3f} | x{exact_m / fast_m:.1f} | {how} | {same} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"CPU seconds per {args.records:,} records (median of {args.rounds})")
    print("| input | record by record | bulk way | x | bulk way taken | rows equal |")
    print("|---|---|---|---|---|---|")
    capture = records(args.records, False, False, False)
    _row("capture shape, JSON with schema blocks", batch_decoder(_PIPELINE), capture, args.rounds)
    with SchemaRegistryDouble(compatibility="NONE") as registry:
        client = SchemaRegistryClient(registry.url)
        decoder = ChangelogBatchDecoder(_PIPELINE.changelog_settings, _PIPELINE.primary_key,
                                        _PIPELINE.effective_upsert_key, value_decoder=ConfluentAvroDecoder(client))
        _row("orders envelopes, Avro", decoder, _avro_records(client, args.records, None), args.rounds)
        _row("orders envelopes, Avro, one union index out of its union", decoder,
             _avro_records(client, args.records, 3), args.rounds)
        values = ConnectAvroConverter(client, "capture").values
        _row("capture shape, Avro", decoder, [values.encode(orjson.loads(value)) for value in capture], args.rounds)


if __name__ == "__main__":
    main()
