"""Range decode benchmark: one Kafka range of Debezium JSON through the plain path's reducer
(`PartitionReducer`), fast way against the record-by-record reference, without Spark or a broker.

Inputs (one row each): the Connect JSON converter's records (schema block on every record) of a
table with bigint id, numeric(12,2) (Decimal), timestamptz (ZonedTimestamp), date, jsonb (Json),
uuid, an enum, text[] and a TOASTed text column (half the updates carry the unavailable-value
placeholder), written compact and with `json.dumps`' spaces; the same with a second schema version
from the middle of the range on (a column added by DDL); and compact with one undecodable record
in the middle (`--records` records, 3 keys in 5 updated). Then Confluent-framed Avro through the
registry (the in-process double): `bench.avro_decode_benchmark`'s orders envelopes (Decimal,
ZonedTimestamp, Date, text, int, bool and Debezium's source block), clean and with one record
in the middle whose union index is out of its union (2 and 3 of 2 branches: the reader refuses both,
found by splitting the failed read), through the same reducer with the Avro value decoder. The range
comes in the service's chunks (`range_reader.BATCH_ROWS`). Prints records/s of each way (the fast way:
the median of `--rounds` runs taken in turns with the other inputs of its format), the ratio, how the
fast way went (vectorised, odd records, fallback reason) and its time against the clean input of its format.

    .venv/bin/python -m bench.range_decode_benchmark --records 50000
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import time
import uuid

import pyarrow as pa

from bench.avro_decode_benchmark import ENVELOPE
from bench.avro_decode_benchmark import records as avro_records
from connectors.kafka.range_reader import BATCH_ROWS, SOURCE_SCHEMA, ValueChunk
from connectors.schema_registry.avro_codec import ConfluentAvroDecoder
from connectors.schema_registry.client import SchemaRegistryClient
from connectors.schema_registry.wire_format import HEADER_SIZE
from service.config.settings import PipelineSettings
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder
from service.kafka_to_delta.materialize.payload import payload_table
from service.kafka_to_delta.source.decode_stage import batch_decoder
from service.kafka_to_delta.source.partition_changes import PartitionReducer
from tests.support.schema_registry_double import SchemaRegistryDouble

_FIELDS = [
    {"field": "id", "type": "int64", "optional": False},
    {"field": "amount", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
     "parameters": {"scale": "2", "connect.decimal.precision": "12"}, "optional": True},
    {"field": "updated_at", "type": "string", "name": "io.debezium.time.ZonedTimestamp", "optional": True},
    {"field": "day", "type": "int32", "name": "io.debezium.time.Date", "optional": True},
    {"field": "doc", "type": "string", "name": "io.debezium.data.Json", "optional": True},
    {"field": "ref", "type": "string", "name": "io.debezium.data.Uuid", "optional": True},
    {"field": "mood", "type": "string", "name": "io.debezium.data.Enum", "parameters": {"allowed": "a,b"},
     "optional": True},
    {"field": "tags", "type": "array", "items": {"type": "string", "optional": True}, "optional": True},
    {"field": "body", "type": "string", "optional": True},
]
_ADDED = {"field": "note", "type": "string", "optional": True}


def _schema(added: bool) -> dict:
    image = {"type": "struct", "optional": True, "fields": _FIELDS + ([_ADDED] if added else [])}
    return {"type": "struct", "name": "db.public.t.Envelope", "fields": [
        {**image, "field": "before"}, {**image, "field": "after"}, {"field": "op", "type": "string"},
        {"field": "ts_ms", "type": "int64", "optional": True}]}


def _row(rng: random.Random, key: int, added: bool) -> dict:
    cents = rng.randrange(-10**9, 10**9)
    row = {
        "id": key, "amount": base64.b64encode(cents.to_bytes(5, "big", signed=True)).decode(),
        "updated_at": f"2026-11-{1 + key % 28:02d}T{key % 24:02d}:{key % 60:02d}:07.{rng.randrange(10**6):06d}Z",
        "day": 20_000 + key % 400, "doc": json.dumps({"k": key, "v": [1, 2]}), "ref": str(uuid.UUID(int=key)),
        "mood": rng.choice("ab"), "tags": ["x", str(key)], "body": "long text " * 300,
    }
    if added:
        row["note"] = "n"
    return row


def records(count: int, spaced: bool, versions: bool, undecodable: bool, seed: int = 7) -> list[bytes]:
    """`count` Debezium values: inserts first, then updates of 3 keys in 5."""
    rng = random.Random(seed)
    separators = (", ", ": ") if spaced else (",", ":")
    keys = max(1, count * 3 // 5)
    values = []
    for index in range(count):
        added = versions and index >= count // 2
        key = index if index < keys else rng.randrange(keys)
        after = _row(rng, key, added)
        if index >= keys and rng.random() < 0.5:
            after["body"] = "__debezium_unavailable_value"
        envelope = {"before": None, "after": after, "op": "c" if index < keys else "u", "ts_ms": 1}
        values.append(json.dumps({"schema": _schema(added), "payload": envelope}, separators=separators).encode())
    if undecodable:
        values[count // 2] = b'{"schema": {"type": "struct"}, "payload": {"op": "c", "after": {"id": 1'
    return values


def _batches(values: list[bytes]) -> list[pa.RecordBatch]:
    n = len(values)
    batch = pa.RecordBatch.from_pydict({
        "key": [b"k"] * n, "value": values, "topic": ["t"] * n, "partition": pa.array([0] * n, pa.int32()),
        "offset": pa.array(range(n), pa.int64()),
        "timestamp": pa.array([1_700_000_000_000_000] * n, pa.timestamp("us", tz="UTC")),
        "headers": pa.nulls(n, SOURCE_SCHEMA.field("headers").type), "watermark_floor": pa.nulls(n, pa.int64()),
    }, schema=SOURCE_SCHEMA)
    return [batch.slice(start, BATCH_ROWS) for start in range(0, n, BATCH_ROWS)]  # chunks as the service reads


def _avro_records(client: SchemaRegistryClient, count: int, union_index: int | None) -> list[bytes]:
    """The orders envelopes; with `union_index` as the middle record's `before` union index (out of
    its 2-branch union: 2 is the bulk container's extra branch, 3 one the Rust reader refuses)."""
    values = avro_records(client.register("orders-value", ENVELOPE), count)
    if union_index is not None:
        damaged = bytearray(values[count // 2])
        damaged[HEADER_SIZE] = union_index * 2  # zigzag
        values[count // 2] = bytes(damaged)
    return values


def _run(values: list[bytes], vectorised: bool, client: SchemaRegistryClient | None = None) -> tuple[float, dict]:
    pipeline = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"])
    decoder = batch_decoder(pipeline) if client is None else ChangelogBatchDecoder(
        pipeline.changelog_settings, pipeline.primary_key, pipeline.effective_upsert_key,
        value_decoder=ConfluentAvroDecoder(client))
    reducer = PartitionReducer(decoder, ("id",), vectorised=vectorised)
    batches = _batches(values)
    started = time.perf_counter()
    out = list(reducer(lambda: iter(batches), lambda: map(ValueChunk.of_batch, batches)))
    elapsed = time.perf_counter() - started
    info = payload_table(out[0].column("payload")[0].as_py())[1]
    return elapsed, info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=7, help="fast-way runs of each input, taken in turns")
    args = parser.parse_args()
    rows = [("compact", False, False, False), ("spaced", True, False, False),
            ("compact, two schema versions", False, True, False), ("compact, one undecodable record", False, False, True)]
    print("| input | fast records/s | reference records/s | x | fast way | against the clean input |")
    print("|---|---|---|---|---|---|")
    _rows({name: records(args.records, spaced, versions, undecodable)
           for name, spaced, versions, undecodable in rows}, None, args.rounds)
    with SchemaRegistryDouble(compatibility="NONE") as registry:
        client = SchemaRegistryClient(registry.url)
        _rows({name: _avro_records(client, args.records, union_index)
               for name, union_index in (("Avro", None), ("Avro, one union index 2 of 2 branches", 2),
                                         ("Avro, one union index 3 of 2 branches", 3))}, client, args.rounds)


def _rows(inputs: dict[str, list[bytes]], client: SchemaRegistryClient | None, rounds: int) -> None:
    """One row per input. The fast way's runs of the inputs are taken in turns (a round runs each once) and
    the median given, so that the ratios against the first (clean) input do not follow the machine's drift."""
    runs: dict[str, list[tuple[float, dict]]] = {name: [] for name in inputs}
    for _ in range(rounds):
        for name, values in inputs.items():
            runs[name].append(_run(values, True, client))
    clean = None
    for name, values in inputs.items():
        fast, info = sorted(runs[name], key=lambda pair: pair[0])[rounds // 2]  # one run of 50,000 takes ~0.3 s
        clean = clean or fast
        exact, _ = _run(values, False, client)
        how = "vectorised" if info.get("vectorised") else f"record by record ({info.get('fallback')})"
        if info.get("odd_records"):
            how += f", {info['odd_records']} odd record(s)"
        print(f"| {name} | {len(values) / fast:,.0f} | {len(values) / exact:,.0f} | {exact / fast:.1f} | {how} | "
              f"x{fast / clean:.2f} |")


if __name__ == "__main__":
    main()
