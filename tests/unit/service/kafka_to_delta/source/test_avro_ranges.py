"""The fast decode of Confluent Avro ranges (`debezium_columns` through `avro_columns`) equals the
record-by-record reference (`ConfluentAvroDecoder`), by what the driver makes of both ways.

Hypothesis draws two Debezium envelope schemas (every logical type `test_avro_columns` covers, a
`long` primary key `id`), registers them in the in-process registry double, and writes a range of
inserts, updates and deletes of a few keys under both schema ids, with tombstones and one damaged
record (a body cut short, or one byte replaced: a union index, a length, a UTF-8 byte) that the
reference decodes or refuses. `derandomize=True`.
"""

from __future__ import annotations

import copy
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.schema_registry.avro_codec import ConfluentAvroDecoder
from connectors.schema_registry.wire_format import frame
from service.config.settings import PipelineSettings
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder
from tests.unit.connectors.schema_registry.test_avro_columns import (  # noqa: F401
    _body,
    client,
    debezium_schemas,
)
from tests.unit.service.kafka_to_delta.source.test_debezium_columns import both_ways

_PIPELINE = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"])


def _with_key(schema: dict) -> dict:
    value = schema["fields"][0]["type"][1]
    value["fields"] = [{"name": "id", "type": "long"}, *value["fields"]]
    return schema


def avro_range(client, data) -> list[tuple[bytes | None, bytes | None]]:  # noqa: F811
    """A drawn range: (Kafka key, Confluent-framed value) pairs of inserts, updates and deletes of a few keys
    under two schema ids (the second adds a column), tombstones after deletes, and one damaged record."""
    first, columns = data.draw(debezium_schemas("db.public.a"), label="schema")
    first = _with_key(first)
    second = copy.deepcopy(first)  # the next version: a column added by DDL
    second["fields"][0]["type"][1]["fields"].append({"name": "added", "type": ["null", "long"], "default": None})
    schemas = [first, second]
    strategies = [st.fixed_dictionaries(columns),
                  st.fixed_dictionaries({**columns, "added": st.none() | st.integers(-5, 5)})]
    ids = [client.register("a-value", first), client.register("a-value", second)]
    pairs: list[tuple[bytes | None, bytes | None]] = []
    rows: dict[int, tuple[int, dict]] = {}
    version = 0
    for _ in range(data.draw(st.integers(1, 30), label="records")):
        version = max(version, data.draw(st.sampled_from([0, 0, 0, 1])))
        key = data.draw(st.integers(0, 4))
        current = rows.get(key)
        key_bytes = b'{"id":%d}' % key
        if current is not None and current[0] == version and data.draw(st.integers(0, 4)) == 0:
            del rows[key]
            record = {"before": current[1], "after": None, "op": "d", "source": {"version": "3", "lsn": None}}
            pairs.append((key_bytes, frame(ids[version], _body(schemas[version], record))))
            pairs.append((key_bytes, None))
            continue
        after = {"id": key, **data.draw(strategies[version])}
        record = {"before": None, "after": after, "op": "c" if current is None else "u",
                  "source": {"version": "3", "lsn": None}}
        rows[key] = (version, after)
        pairs.append((key_bytes, frame(ids[version], _body(schemas[version], record))))
    damage = data.draw(st.sampled_from([None, "cut short", "byte replaced"]), label="one damaged record")
    position = data.draw(st.integers(0, len(pairs) - 1))
    key_bytes, value = pairs[position]
    if damage == "cut short" and value is not None:
        pairs[position] = (key_bytes, value[:6])
    elif damage == "byte replaced" and value is not None:
        at = data.draw(st.integers(5, len(value) - 1), label="at")
        byte = data.draw(st.sampled_from([0x03, 0x04, 0x06, 0x80, 0xFF]) | st.integers(0, 255), label="byte")
        pairs[position] = (key_bytes, value[:at] + bytes([byte]) + value[at + 1:])
    return pairs


AVRO_RANGES = settings(max_examples=60, derandomize=True, deadline=None,
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                              HealthCheck.function_scoped_fixture])
"""The hypothesis settings of the tests drawing `avro_range`s."""


@AVRO_RANGES
@given(data=st.data())
def test_avro_ranges_decode_in_bulk_as_record_by_record(client, data) -> None:  # noqa: F811
    pairs = avro_range(client, data)
    ignore_nulls = data.draw(st.booleans(), label="ignore_null_updates")  # nulls of updates as unchanged markers

    def decoder() -> ChangelogBatchDecoder:
        return ChangelogBatchDecoder(_PIPELINE.changelog_settings, _PIPELINE.primary_key,
                                     _PIPELINE.effective_upsert_key, value_decoder=ConfluentAvroDecoder(client),
                                     ignore_null_updates=ignore_nulls)

    info = both_ways(pairs, random.Random(data.draw(st.integers(0, 2**16))), decoder)
    if info is not None:
        assert info["vectorised"], info.get("fallback")
