"""Spec 4.1 examples and use cases end to end: JSON records in Kafka -> `cdc-lakehouse run
--until-idle` -> Delta tables read back with deltalake, each equal to the table the example
leaves. One pipeline (topic + table) per example, all in one run so Spark starts once."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from service.operations.workload import Event, create_topics, produce
from tests.support.pipeline_harness import run_cli, table_rows, write_config

pytestmark = pytest.mark.slow

UPSERT_OPS = {"c, r": "INSERT", "d": "DELETE", "u": "UPDATE_AFTER"}
RETRACT_OPS = {"c, r": "INSERT", "d": "DELETE", "u": "UPDATE_BEFORE, UPDATE_AFTER"}
CDC_OPS = {"c": "INSERT", "d": "DELETE", "u": "UPDATE_AFTER"}
ALICE, BOB = {"id": 5, "name": "Alice", "age": 30}, {"id": 6, "name": "Bob", "age": 7}


def at(clock: str) -> str:
    return f"2024-01-01T{clock}:00Z"


@dataclass
class Example:
    """One spec example: its FROM_CHANGELOG settings, the records (key, value) and the table it leaves."""

    name: str
    from_changelog: dict
    records: list[tuple[dict | None, dict | None]]
    expected: list[dict]
    primary_key: str = "id"
    pipeline: dict = field(default_factory=dict)

    def events(self, topic: str) -> list[Event]:
        return [Event(topic, 0, _json(key), _json(value)) for key, value in self.records]


def _json(document: dict | None) -> bytes | None:
    return None if document is None else json.dumps(document).encode()


def one_per_batch(name: str, from_changelog: dict, records: list[dict], expected: list[dict]) -> Example:
    """An example whose records each get a micro-batch of their own (the table exists when it ends empty)."""
    return Example(name, from_changelog, [(None, r) for r in records], expected,
                   pipeline={"max_offsets_per_trigger": 1})


EXAMPLES = [
    one_per_batch(  # 4.1.1 default signature
        "default", {}, [{"op": "INSERT", "id": 5, "name": "name"}, {"op": "DELETE", "id": 5, "name": "name"}], [],
    ),
    one_per_batch(  # 4.1.2.1.1 flat records with a custom header
        "custom_op", {"op": "type"},
        [{"type": "INSERT", "id": 5, "name": "name"}, {"type": "DELETE", "id": 5, "name": "name"}], [],
    ),
    Example(  # 4.1.2.1.2 'u' -> -U, +U from the before and after images
        "u_retract", {"before": "before", "after": "after", "op_mapping": {"u": "UPDATE_BEFORE, UPDATE_AFTER"}},
        [(None, {"op": "u", "before": {"id": 5, "name": "old"}, "after": {"id": 5, "name": "new"}})],
        [{"id": 5, "name": "new"}],
    ),
    Example(  # 4.1.3.1 upsert stream to upsert stream with __op
        "upsert_op", {"op": "__op", "op_mapping": UPSERT_OPS},
        [(None, {"__op": op, "id": i, "v": v}) for op, i, v in [("c", 1, "a"), ("r", 2, "x"), ("u", 1, "b"),
                                                                  ("d", 2, "x")]],
        [{"id": 1, "v": "b"}],
    ),
    Example(  # 4.1.3.5 partial deletes (key columns only)
        "partial_deletes", {"op_mapping": CDC_OPS},
        [(None, {"op": "c", **ALICE}), (None, {"op": "c", **BOB}), (None, {"op": "d", "id": 5})], [BOB],
    ),
    Example(  # 4.1.3.6 full deletes
        "full_deletes", {"consume_full_deletes": True, "op_mapping": CDC_OPS},
        [(None, {"op": "c", **ALICE}), (None, {"op": "u", **BOB}), (None, {"op": "d", **ALICE})], [BOB],
    ),
    Example(  # 4.1.3.7 deletion flag -> retract stream (state: the previous image gives -U)
        "flag_retract", {"op": "deleted", "state_ttl_seconds": 600,
                         "op_mapping": {"false": "INSERT, UPDATE_BEFORE, UPDATE_AFTER", "true": "DELETE"}},
        [(None, {"deleted": d, "id": i, "v": v}) for d, i, v in [(False, 1, "a"), ("false", 2, "x"), (False, 1, "b"),
                                                                   (True, 2, "x"), ("false", 3, "y")]],
        [{"id": 1, "v": "b"}, {"id": 3, "v": "y"}], pipeline={"max_offsets_per_trigger": 2},
    ),
    Example(  # 4.1.3.8 deletion flag -> upsert stream (state: +I or +U), the preset's field name
        "flag_upsert", {"preset": "deletion-flag", "state_ttl_seconds": 600},
        [(None, {"__deleted": d, "id": i, "v": v}) for d, i, v in [("false", 1, "a"), ("false", 1, "b"),
                                                                     ("false", 2, "x"), ("true", 2, "x")]],
        [{"id": 1, "v": "b"}], pipeline={"max_offsets_per_trigger": 2},
    ),
    Example(  # 4.1.3.9 upsert stream to retract stream (state)
        "upsert_retract", {"op": "__op", "state_ttl_seconds": 600, "op_mapping": RETRACT_OPS},
        [(None, {"__op": op, "id": i, "v": v}) for op, i, v in [("c", 1, "a"), ("c", 2, "x"), ("u", 1, "b"),
                                                                  ("u", 2, "y"), ("d", 2, "y"), ("u", 1, "c")]],
        [{"id": 1, "v": "c"}], pipeline={"max_offsets_per_trigger": 2},
    ),
    Example(  # 4.1.3.11 CDC envelope with ts_ms passed through as a column
        "passthrough", {"preset": "debezium", "passthrough": ["ts_ms"], "op_mapping": UPSERT_OPS},
        [(None, {"op": "c", "ts_ms": 1234, "before": None, "after": {"user_id": 1, "name": "Alice"}}),
         (None, {"op": "c", "ts_ms": 1300, "before": None, "after": {"user_id": 2, "name": "Bob"}}),
         (None, {"op": "u", "ts_ms": 1400, "before": None, "after": {"user_id": 2, "name": "Robert"}})],
        [{"user_id": 1, "name": "Alice", "ts_ms": 1234}, {"user_id": 2, "name": "Robert", "ts_ms": 1400}],
        primary_key="user_id",
    ),
    Example(  # upsert-kafka: key columns from the Kafka key, a null value deletes
        "upsert_kafka", {"preset": "upsert-kafka"},
        [({"id": 1}, {"v": "a"}), ({"id": 2}, {"v": "x"}), ({"id": 1}, {"v": "b"}), ({"id": 2}, None)],
        [{"id": 1, "v": "b"}],
    ),
    Example(  # 4.1.2.2.1 ORDER BY with a 5 minute watermark delay: B is late and dropped, C stays buffered
        "order_by", {"order_by": "event_time", "watermark_delay_seconds": 300},
        [(None, {"op": "INSERT", "id": i, "name": n, "event_time": at(t)})
         for i, n, t in [(6, "A", "10:05"), (5, "B", "09:55"), (7, "C", "10:11")]],
        [{"id": 6, "name": "A", "event_time": at("10:05")}], pipeline={"max_offsets_per_trigger": 1},
    ),
]


def test_spec_4_1_examples_through_kafka_and_delta(kafka_bootstrap, unique, workdir):
    topics = {example.name: f"fc.{example.name}.{unique}" for example in EXAMPLES}
    create_topics(kafka_bootstrap, topics.values(), 1)
    produce(kafka_bootstrap, [event for example in EXAMPLES for event in example.events(topics[example.name])])
    pipelines = [
        {"name": f"p_{example.name}", "topics": [topics[example.name]], "table": f"t_{example.name}",
         "primary_key": [example.primary_key], "from_changelog": example.from_changelog, **example.pipeline}
        for example in EXAMPLES
    ]
    config = write_config(workdir / "config.yaml", kafka_bootstrap, workdir, pipelines)
    result = run_cli(config, "--until-idle")
    assert result.returncode == 0, result.stderr[-3000:]
    tables = {
        example.name: table_rows(workdir / "tables" / f"t_{example.name}", order_by=example.primary_key)
        for example in EXAMPLES
    }
    assert tables == {example.name: example.expected for example in EXAMPLES}
