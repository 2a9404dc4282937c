"""Mutated Kafka change records for fuzzing the decoder (unit test, e2e test, bench/fuzz_benchmark.py).

`generate(seed, count)` spreads `count` records over four input formats (`FORMATS`), each topic
with `PARTITIONS` partitions: Debezium JSON envelopes inside the Kafka Connect wrapper (schema
block), bare Debezium JSON envelopes, flat op-coded JSON records and Confluent-framed Avro
envelopes. Each starts as a valid record of the synthetic workload (`service.operations.workload`), then one
mutation from `MUTATIONS` is applied to it (`"none"` keeps it intact): truncated values, invalid
UTF-8, flipped bits, wrong magic bytes, unknown or unusable schema ids, wrong field types, missing
fields, unknown op codes, huge strings and numbers, non-finite numbers, deep nesting, lone UTF-16
surrogates, thousands of columns, broken schema blocks, null or broken keys, null values.
Headers are random too (binary values, null values). Everything is drawn from `random.Random(seed)`.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import fastavro
import pyarrow as pa

from connectors.kafka.range_reader import RAW_SCHEMA
from connectors.schema_registry import ConfluentAvroDecoder
from connectors.schema_registry.client import RegisteredSchema, schema_text
from connectors.schema_registry.errors import UnknownSchemaIdError
from service.config.from_changelog import FromChangelogSettings, RecordHandling
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder
from service.operations.workload import DebeziumWorkload, Event
from testbed.avro_workload import AvroWorkloadEncoder
from testbed.fuzz_documents import MutationContext, dumps
from testbed.fuzz_mutations import mutate

PRIMARY_KEY = ("id",)
PARTITIONS = 3
POLICIES: tuple[RecordHandling, ...] = ("FAIL", "LOG", "SKIP", "DEAD_LETTER")
TIMESTAMP = datetime(2026, 11, 24, tzinfo=timezone.utc)
PIPELINE_PARAMS = {"truncate_handling": "ignore"}
Headers = list[tuple[str, bytes | None]] | None


@dataclass(frozen=True)
class FuzzFormat:
    """One input format: its topic and FROM_CHANGELOG parameters (policies are set per run).

    `decoder_only` parameters apply to the pure decoder runs only; a pipeline (the e2e test) leaves
    them out (`order_by` would make it buffer by event time) and ignores truncates, which would
    otherwise stop it under every policy (`truncate_handling: fail`) or empty its table.
    """

    name: str
    params: dict[str, Any]
    avro: bool = False
    schema_block: bool = False
    decoder_only: dict[str, Any] = field(default_factory=dict)

    @property
    def typed(self) -> bool:
        """Records declare their column types (a Connect schema block, or Avro)."""
        return self.avro or self.schema_block

    @property
    def topic(self) -> str:
        """The format's input topic."""
        return f"fuzz-{self.name}"

    def config(self, policy: RecordHandling, pipeline: bool = False) -> dict[str, Any]:
        """The `from_changelog` parameters with both bad-record policies set to `policy`."""
        extra = PIPELINE_PARAMS if pipeline else self.decoder_only
        return {**self.params, **extra, "decode_error_handling": policy, "invalid_op_handling": policy}

    def settings(self, policy: RecordHandling, pipeline: bool = False) -> FromChangelogSettings:
        """The FROM_CHANGELOG settings of `config`."""
        return FromChangelogSettings(**self.config(policy, pipeline))


FORMATS = {
    f.name: f for f in (
        FuzzFormat("debezium-schema", {"preset": "debezium", "sequence_by": ["ts_ms"], "truncate_handling": "truncate"},
                   schema_block=True),
        FuzzFormat("debezium", {"preset": "debezium", "passthrough": ["ts_ms"]}, decoder_only={"order_by": "ts_ms"}),
        FuzzFormat("flat", {"preset": "flat"}),
        FuzzFormat("debezium-avro", {"preset": "debezium", "truncate_handling": "ignore"}, avro=True),
    )
}


class FakeRegistry:
    """A Schema Registry client double in memory: `register` and `schema_by_id` only."""

    url = "memory://fuzz-registry"

    def __init__(self) -> None:
        self.by_id: dict[int, RegisteredSchema] = {}
        self._ids: dict[str, int] = {}

    def register(self, subject: str, schema: Any) -> int:
        """The id of `schema` (registered on first use)."""
        text = schema_text(schema)
        if text not in self._ids:
            definition = json.loads(text)
            self._ids[text] = schema_id = len(self._ids) + 1
            self.by_id[schema_id] = RegisteredSchema(schema_id, text, definition, fastavro.parse_schema(definition))
        return self._ids[text]

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        """The schema of `schema_id`; `UnknownSchemaIdError` when none is registered."""
        if schema_id not in self.by_id:
            raise UnknownSchemaIdError(schema_id, self.url)
        return self.by_id[schema_id]


@dataclass(frozen=True)
class FuzzRecord:
    """One Kafka record of the fuzz input and the mutation applied to it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    mutation: str

    @property
    def coordinates(self) -> tuple[str, int, int]:
        """(topic, partition, offset)."""
        return self.topic, self.partition, self.offset


def decoders(policy: RecordHandling, registry: Any, pipeline: bool = False) -> dict[str, ChangelogBatchDecoder]:
    """topic -> the decoder of its format under `policy` (Avro through `registry`)."""
    return {
        fmt.topic: ChangelogBatchDecoder(
            fmt.settings(policy, pipeline), PRIMARY_KEY,
            value_decoder=ConfluentAvroDecoder(registry) if fmt.avro else None,  # type: ignore[arg-type]
        )
        for fmt in FORMATS.values()
    }


def raw_batch(records: list[FuzzRecord]) -> pa.RecordBatch:
    """The records as one Kafka record batch (`RAW_SCHEMA`)."""
    return pa.RecordBatch.from_pydict(
        {
            "key": [r.key for r in records], "value": [r.value for r in records],
            "topic": [r.topic for r in records], "partition": [r.partition for r in records],
            "offset": [r.offset for r in records], "timestamp": [TIMESTAMP] * len(records),
            "headers": [header_rows(r.headers) for r in records],
        },
        schema=RAW_SCHEMA,
    )


def header_rows(headers: Headers) -> list[dict] | None:
    """Headers as the Arrow column holds them."""
    return None if headers is None else [{"key": k, "value": v} for k, v in headers]


# --- valid records ---------------------------------------------------------------------


def _flat(event: Event) -> list[Event]:
    """A bare Debezium event as flat op-coded records (an update: UPDATE_BEFORE then UPDATE_AFTER)."""
    if event.value is None:
        return [event]
    payload = json.loads(event.value)
    op, before, after = payload["op"], payload["before"], payload["after"]
    steps = {"c": [("INSERT", after)], "r": [("INSERT", after)], "d": [("DELETE", before)],
             "u": [("UPDATE_BEFORE", before), ("UPDATE_AFTER", after)]}[op]
    return [Event(event.topic, event.partition, event.key, dumps({"op": kind, **image})) for kind, image in steps]


def _valid_events(fmt: FuzzFormat, count: int, seed: int) -> list[Event]:
    workload = DebeziumWorkload(fmt.topic, PARTITIONS, "always" if fmt.schema_block else "never", seed=seed)
    events = workload.generate(count, max(count // 4, 1))
    if fmt.name == "flat":
        events = [flat for event in events for flat in _flat(event)]
    return events[:count]


@dataclass(frozen=True)
class FuzzInput:
    """The records of one seed and the registry holding their Avro schemas."""

    seed: int
    records: list[FuzzRecord] = field(repr=False)
    registry: Any  # a FakeRegistry or a SchemaRegistryClient


def generate(seed: int, count: int, registry: Any = None,
             exclude: dict[str, frozenset[str]] | None = None) -> FuzzInput:
    """`count` records over the four formats, mutated (see the module docstring).

    `registry`: where the Avro schemas are registered (a `SchemaRegistryClient`, or by default a
    new `FakeRegistry`); the decoders of this input must read from the same one. `exclude`:
    format name -> mutations not to apply to its records.
    """
    rng = random.Random(seed)
    registry = FakeRegistry() if registry is None else registry
    records: list[FuzzRecord] = []
    formats = list(FORMATS.values())
    for index, fmt in enumerate(formats):
        share = count // len(formats) + (1 if index < count % len(formats) else 0)
        avro = AvroWorkloadEncoder(registry, fmt.topic) if fmt.avro else None  # type: ignore[arg-type]
        excluded = (exclude or {}).get(fmt.name, frozenset())
        context = MutationContext(rng, fmt.name, fmt.schema_block, avro, registry, excluded)
        offsets = [0] * PARTITIONS
        for event in _valid_events(fmt, share, seed + index):
            name, key, value = mutate(context, event)
            records.append(FuzzRecord(fmt.topic, event.partition, offsets[event.partition], key, value,
                                      _headers(rng), name))
            offsets[event.partition] += 1
    return FuzzInput(seed, records, registry)


def _headers(rng: random.Random) -> Headers:
    choice = rng.random()
    if choice < 0.5:
        return None
    if choice < 0.6:
        return []
    return [(rng.choice(["trace", "source", "h\u00e9"]), rng.choice([None, b"", rng.randbytes(rng.randrange(1, 12))]))
            for _ in range(rng.randrange(1, 4))]


