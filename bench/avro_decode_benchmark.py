"""Avro decode throughput: the reference decoder per record, fastavro, and the bulk decoder to Arrow.

200,000 Debezium-shaped Confluent-framed records (an `orders` row image: numeric(12,2) as a Connect
Decimal, timestamptz as a ZonedTimestamp text, date as io.debezium.time.Date, text, int, bool, and
Debezium's source block), one schema id, decoded with:

  reference    ConfluentAvroDecoder.decode per record (JSON-form documents), then rows_to_table
               of the row images (the typed columns the bulk decoder gives)
  fastavro     fastavro.schemaless_reader per record (raw values, no typing)
  fastavro-block  fastavro's block reader over the same in-memory container (raw values, no typing)
  bulk         avro_columns.decode_avro_columns: typed Arrow columns

Prints records/s per way (best of --repeat), in the process, one core: by wall clock and by the
process's CPU time (steadier on a loaded machine). The registry is the in-process double. Usage: .venv/bin/python -m bench.avro_decode_benchmark [--records N] [--repeat R]
"""

from __future__ import annotations

import argparse
import io
import json
import time
from datetime import datetime, timedelta
from typing import Callable

import fastavro

from connectors.delta.arrow_types import rows_to_table
from connectors.schema_registry.avro_codec import ConfluentAvroDecoder, without_logical_types
from connectors.schema_registry.avro_columns import BulkAvroDecoder
from connectors.schema_registry.client import SchemaRegistryClient
from connectors.schema_registry.wire_format import HEADER_SIZE, frame
from tests.support.schema_registry_double import SchemaRegistryDouble

DECIMAL = "org.apache.kafka.connect.data.Decimal"


def _nullable(name: str, avro: object) -> dict:
    return {"name": name, "type": ["null", avro], "default": None}


VALUE = {"type": "record", "name": "Value", "fields": [
    {"name": "id", "type": "int"},
    _nullable("amount", {"type": "bytes", "scale": 2, "precision": 12, "connect.version": 1,
                         "connect.parameters": {"scale": "2", "connect.decimal.precision": "12"},
                         "connect.name": DECIMAL, "logicalType": "decimal"}),
    _nullable("updated_at", {"type": "string", "connect.version": 1, "connect.name": "io.debezium.time.ZonedTimestamp"}),
    _nullable("day", {"type": "int", "connect.version": 1, "connect.name": "io.debezium.time.Date"}),
    _nullable("note", "string"),
    _nullable("qty", "int"),
    _nullable("active", "boolean"),
]}
SOURCE = {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql", "fields": [
    {"name": "version", "type": "string"}, {"name": "connector", "type": "string"}, {"name": "name", "type": "string"},
    {"name": "ts_ms", "type": "long"}, {"name": "snapshot", "type": [{"type": "string", "connect.version": 1,
     "connect.parameters": {"allowed": "true,last,false,incremental"}, "connect.default": "false",
     "connect.name": "io.debezium.data.Enum"}, "null"], "default": "false"},
    {"name": "db", "type": "string"}, {"name": "schema", "type": "string"}, {"name": "table", "type": "string"},
    _nullable("txId", "long"), _nullable("lsn", "long"), _nullable("xmin", "long")]}
ENVELOPE = {"type": "record", "name": "Envelope", "namespace": "dbserver1.public.orders", "fields": [
    _nullable("before", VALUE), _nullable("after", "Value"), {"name": "source", "type": SOURCE},
    {"name": "op", "type": "string"}, _nullable("ts_ms", "long")]}
START = datetime(2026, 11, 27, 8, 0, 0)


def records(schema_id: int, count: int) -> list[bytes]:
    """`count` framed change events: inserts, and updates with a before image every third."""
    writer = fastavro.parse_schema(without_logical_types(ENVELOPE))
    out = []
    for i in range(count):
        unscaled = (i * 7_919) % 10**11 - 5 * 10**10
        moment = START + timedelta(seconds=i, microseconds=i * 37 % 1_000_000)
        row = {"id": i, "amount": unscaled.to_bytes(unscaled.bit_length() // 8 + 1, "big", signed=True),
               "updated_at": moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "day": 20_000 + i % 365,
               "note": f"order {i} for customer {i % 977}", "qty": i % 1_000, "active": i % 2 == 0}
        update = i % 3 == 0
        source = {"version": "3.6.3.Final", "connector": "postgresql", "name": "dbserver1", "ts_ms": 1_795_000_000_000 + i,
                  "snapshot": "false", "db": "app", "schema": "public", "table": "orders", "txId": 1_000 + i,
                  "lsn": 40_000_000 + i * 64, "xmin": None}
        event = {"before": {**row, "qty": None} if update else None, "after": row, "source": source,
                 "op": "u" if update else "c", "ts_ms": 1_795_000_000_100 + i}
        stream = io.BytesIO()
        fastavro.schemaless_writer(stream, writer, event)
        out.append(frame(schema_id, stream.getvalue()))
    return out


def best_rate(count: int, repeat: int, decode: Callable[[], object]) -> tuple[float, float]:
    """(records/s by wall clock, records/s by CPU time), each the best of `repeat` runs."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.process_time()
        decode()
        wall, cpu = min(wall, time.perf_counter() - started), min(cpu, time.process_time() - started_cpu)
    return count / wall, count / cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with SchemaRegistryDouble(compatibility="NONE") as registry:
        client = SchemaRegistryClient(registry.url)
        schema_id = client.register("dbserver1.public.orders-value", ENVELOPE)
        values = records(schema_id, args.records)
        reference = ConfluentAvroDecoder(client)
        codec = reference.codec(schema_id)
        bulk = BulkAvroDecoder(reference)
        bulk.decode(values[:10])  # the plan and the reader's import, once

        def per_record() -> object:
            return [reference.decode(value)[0] for value in values]

        def per_record_typed() -> object:
            documents = per_record()
            return rows_to_table([document["after"] for document in documents], codec.column_types)

        raw_schema = codec.raw_schema

        def fastavro_per_record() -> object:
            return [fastavro.schemaless_reader(io.BytesIO(memoryview(value)[HEADER_SIZE:]), raw_schema, None)
                    for value in values]

        container = io.BytesIO()
        fastavro.writer(container, fastavro.parse_schema(without_logical_types(ENVELOPE)),
                        [fastavro.schemaless_reader(io.BytesIO(value[HEADER_SIZE:]), raw_schema, None)
                         for value in values], codec="null", sync_interval=1 << 40)
        container_bytes = container.getvalue()

        def fastavro_block() -> object:
            return list(fastavro.reader(io.BytesIO(container_bytes)))

        def bulk_decode() -> object:
            decoded = bulk.decode(values)
            assert not decoded.fallback and decoded.groups[schema_id].table.num_rows == len(values)
            return decoded

        ways = [
            ("reference ConfluentAvroDecoder.decode", per_record, 1),
            ("reference decode + rows_to_table(after)", per_record_typed, 1),
            ("fastavro schemaless_reader per record", fastavro_per_record, 1),
            ("fastavro block reader (container)", fastavro_block, 1),
            ("bulk decode_avro_columns (typed Arrow)", bulk_decode, args.repeat),
        ]
        results = {}
        for label, decode, repeat in ways:
            results[label] = best_rate(len(values), max(1, min(repeat, args.repeat)), decode)
            wall, cpu = results[label]
            print(f"{label:44s} {wall:>10,.0f} records/s wall {cpu:>10,.0f} records/s CPU", flush=True)
        print(json.dumps({"records": len(values), "records_per_second": {
            label: {"wall": round(wall), "cpu": round(cpu)} for label, (wall, cpu) in results.items()}}))


if __name__ == "__main__":
    main()
