"""The events of a `service.operations.workload.DebeziumWorkload`, re-encoded as Confluent Avro.

The same workload can then be fed once as JSON and once as Avro, and the two resulting Delta
tables compared. Each JSON event becomes one Avro event with the same topic, partition and
order; tombstones stay null.

- Value: a Debezium-style envelope record `<topic>.Envelope` (before, after, op, ts_ms; the
  workload has no `source` block) registered under `<topic>-value` (TopicNameStrategy). Its
  row columns are the ones the workload's Connect schema block gives, so the Avro value's
  column types equal the JSON value's (`updated_at`: timestamp_us, local-timestamp-micros).
- Key: by default ("json") the JSON key bytes are kept as they are, so partitioning and the
  key-based delete path behave exactly as with JSON; "avro" frames the key as a required
  `<topic>.Key` record `{id: long}` registered under `<topic>-key`, as Confluent's
  AvroConverter would.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Iterable, Literal

from connectors.delta.arrow_types import TypeName
from connectors.delta.connect_types import connect_schema_to_types
from connectors.schema_registry.avro_codec import ConfluentAvroEncoder
from connectors.schema_registry.avro_types import (
    avro_name,
    avro_schema_for,
    debezium_envelope_schema,
)
from connectors.schema_registry.client import SchemaRegistryClient
from service.operations.workload import DebeziumWorkload, Event
from vocabulary.changes import Envelope

KeyFormat = Literal["json", "avro"]
KEY_COLUMN = "id"
VALUE_SUBJECT_SUFFIX, KEY_SUBJECT_SUFFIX = "-value", "-key"
KEY_RECORD = "Key"
PAYLOAD_FIELDS = (Envelope.BEFORE, Envelope.AFTER, Envelope.OP, Envelope.TS_MS)


def workload_column_types(with_timestamp: bool) -> dict[str, str]:
    """Row column types of a workload, as its own Connect schema block states them."""
    probe = DebeziumWorkload("probe", 1, "always", with_timestamp=with_timestamp)
    value = probe.next_events(0)[0].value
    return connect_schema_to_types(json.loads(value)[Envelope.SCHEMA])


def _payload(value: bytes) -> dict:
    document = json.loads(value)
    if isinstance(document, dict) and document.keys() == {Envelope.SCHEMA, Envelope.PAYLOAD}:
        document = document[Envelope.PAYLOAD]
    return {field: document.get(field) for field in PAYLOAD_FIELDS}


class AvroWorkloadEncoder:
    """Re-encodes one topic's workload events as Confluent Avro (see the module docstring)."""

    def __init__(self, client: SchemaRegistryClient, topic: str, *, with_timestamp: bool = False,
                 key_format: KeyFormat = "json") -> None:
        self.topic, self.key_format = topic, key_format
        self.columns = workload_column_types(with_timestamp)
        namespace = avro_name(topic)
        self.value_schema = debezium_envelope_schema(namespace, self.columns, required=(KEY_COLUMN,))
        self.key_schema = avro_schema_for(KEY_RECORD, {KEY_COLUMN: TypeName.INT64}, namespace=namespace,
                                          required=(KEY_COLUMN,))
        self.values = ConfluentAvroEncoder(client, topic + VALUE_SUBJECT_SUFFIX, self.value_schema)
        self.keys = ConfluentAvroEncoder(client, topic + KEY_SUBJECT_SUFFIX, self.key_schema)

    def encode(self, event: Event) -> Event:
        """The Avro event for one JSON event of this topic."""
        value = None if event.value is None else self.values.encode(_payload(event.value))
        key = event.key
        if self.key_format == "avro" and key is not None:
            key = self.keys.encode(json.loads(key))
        return replace(event, key=key, value=value)


def to_avro(events: Iterable[Event], client: SchemaRegistryClient, *, with_timestamp: bool = False,
            key_format: KeyFormat = "json") -> list[Event]:
    """All events re-encoded as Confluent Avro, in order; one encoder per topic."""
    encoders: dict[str, AvroWorkloadEncoder] = {}
    out = []
    for event in events:
        encoder = encoders.get(event.topic)
        if encoder is None:
            encoder = AvroWorkloadEncoder(client, event.topic, with_timestamp=with_timestamp, key_format=key_format)
            encoders[event.topic] = encoder
        out.append(encoder.encode(event))
    return out
