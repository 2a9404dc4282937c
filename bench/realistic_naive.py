"""The naive pipeline of `perf_naive.py` for real Debezium captures: any table keyed by `id`, JSON with or
without the Connect schema blocks, or Confluent Avro (fastavro, writer schemas fetched from the registry).

Same yardstick: consume from offset 0 to the high watermarks, keep the last change per key per
window of records, one delta-rs MERGE per window; no disorder handling, no exactly once. What it
adds is only what these inputs need for a correct table:
- the columns and their Arrow types are those of the first window (a column null there is a
  string; decimals widen to precision 38), every later window is cast to them;
- Debezium's TOAST placeholder (`__debezium_unavailable_value`) in a string column means "unchanged":
  an earlier change of the key in the window supplies the value, else the MERGE keeps the stored one.
"""

from __future__ import annotations

import io
import time
from typing import Callable

import fastavro
import orjson
import pyarrow as pa
import requests
from deltalake import DeltaTable, write_deltalake
from perf_naive import messages_to_high_watermarks

KEY = "id"
DELETED = "_deleted"
UNAVAILABLE = "__debezium_unavailable_value"

Decode = Callable[[bytes], dict]
"""A Kafka value -> its Debezium payload (op, before, after, ...)."""


def json_payload(value: bytes) -> dict:
    """A Debezium JSON value, with or without the Connect schema block."""
    document = orjson.loads(value)
    return document["payload"] if "schema" in document and "payload" in document else document


class AvroPayloads:
    """Confluent-framed Avro values, writer schemas fetched by id from the registry (cached)."""

    def __init__(self, registry_url: str) -> None:
        self.url, self.schemas = registry_url.rstrip("/"), {}

    def __call__(self, value: bytes) -> dict:
        schema_id = int.from_bytes(value[1:5], "big")
        schema = self.schemas.get(schema_id)
        if schema is None:
            answer = requests.get(f"{self.url}/schemas/ids/{schema_id}", timeout=30)
            answer.raise_for_status()
            schema = self.schemas[schema_id] = fastavro.parse_schema(orjson.loads(answer.json()["schema"]))
        return fastavro.schemaless_reader(io.BytesIO(value[5:]), schema)


class Window:
    """The last change per key of one window of records."""

    def __init__(self) -> None:
        self.last: dict[object, dict | None] = {}

    def keep(self, payload: dict) -> None:
        if payload["op"] == "d":
            self.last[payload["before"][KEY]] = None
            return
        after = dict(payload["after"])
        key = after[KEY]
        earlier = self.last.get(key)
        for name, value in after.items():
            if value == UNAVAILABLE and earlier and earlier.get(name) != UNAVAILABLE:
                after[name] = earlier.get(name)
        self.last[key] = after


class NaiveTable:
    """The Delta table, created with the first window's columns; one MERGE per window."""

    def __init__(self, uri: str) -> None:
        self.uri, self.schema, self.table = uri, None, None

    def _first(self, rows: list[dict]) -> None:
        inferred = pa.Table.from_pylist(rows).schema
        fields = []
        for field in inferred:
            kind = field.type
            if pa.types.is_null(kind):
                kind = pa.string()
            elif pa.types.is_decimal(kind):
                kind = pa.decimal128(38, kind.scale)
            elif pa.types.is_list(kind) and pa.types.is_null(kind.value_type):
                kind = pa.list_(pa.string())
            fields.append(pa.field(field.name, kind))
        self.schema = pa.schema(fields)
        write_deltalake(self.uri, self.schema.empty_table())
        self.table = DeltaTable(self.uri)

    def merge(self, window: Window) -> None:
        rows, deleted = [], []
        for key, row in window.last.items():
            rows.append(row if row is not None else {KEY: key})
            deleted.append(row is None)
        if self.schema is None:
            self._first([row for row in rows if len(row) > 1] or rows)
        source = pa.Table.from_pylist(rows, schema=self.schema).append_column(DELETED, pa.array(deleted))
        names = [name for name in self.schema.names if name != KEY]
        updates = {name: (f"CASE WHEN s.{name} = '{UNAVAILABLE}' THEN t.{name} ELSE s.{name} END"
                          if pa.types.is_string(self.schema.field(name).type) else f"s.{name}") for name in names}
        (self.table.merge(source, f"t.{KEY} = s.{KEY}", source_alias="s", target_alias="t")
         .when_matched_delete(predicate=f"s.{DELETED}")
         .when_matched_update(updates=updates, predicate=f"NOT s.{DELETED}")
         .when_not_matched_insert(updates={c: f"s.{c}" for c in self.schema.names}, predicate=f"NOT s.{DELETED}")
         .execute())


def run_naive_changes(bootstrap: str, topic: str, partitions: int, uri: str, decode: Decode,
                      window: int = 50_000) -> dict[str, float]:
    """Ingest `topic` (offset 0 to the high watermarks) into a new Delta table at `uri`.

    {'records', 'seconds', 'merges'}; seconds from the consumer's creation to the last MERGE.
    """
    started = time.perf_counter()
    table, current = NaiveTable(uri), Window()
    records = merges = in_window = 0
    for message in messages_to_high_watermarks(bootstrap, topic, partitions):
        records, in_window = records + 1, in_window + 1
        if message.value() is not None:  # a tombstone follows its delete
            current.keep(decode(message.value()))
        if in_window >= window:
            table.merge(current)
            merges, in_window, current = merges + 1, 0, Window()
    if current.last:
        table.merge(current)
        merges += 1
    return {"records": records, "seconds": time.perf_counter() - started, "merges": merges}
