"""Dead letters of a pipeline with masked columns (`dead_letter_masks`): the masked values replaced by
the table's masked form wherever a decodable key or value holds them, undecodable bytes dropped with
the reason saying so; the masked form is the one Spark computes for the table."""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa

from service.kafka_to_delta.sink.dead_letter_masks import DeadLetterMasks
from service.kafka_to_delta.sink.dead_letters import INPUT_SCHEMA

SALT = "salt-9"
RAW = "raw-mail-5521@example.org"


def _sha(text: str) -> str:
    return hashlib.sha256((SALT + text).encode()).hexdigest()


def _letters(pairs: list[tuple[bytes | None, bytes | None]]) -> pa.Table:
    n = len(pairs)
    return pa.table({
        "raw_key": [k for k, _ in pairs], "raw_value": [v for _, v in pairs], "headers": [None] * n,
        "topic": ["t"] * n, "partition": [0] * n, "offset": list(range(n)), "timestamp": [None] * n,
        "stage": ["decode"] * n, "error": ["reason"] * n,
    }).cast(INPUT_SCHEMA)


def test_masked_fields_are_replaced_wherever_they_sit_and_undecodable_bytes_dropped() -> None:
    masks = DeadLetterMasks(["email", "id"], SALT)
    envelope = {"before": {"id": 7, "email": RAW, "name": "n"}, "after": {"id": 7, "email": None, "name": "m"},
                "op": "z", "source": {"list": [{"email": RAW}]}}
    wrapped = {"schema": {"type": "struct", "fields": [{"field": "email", "type": "string"}]},
               "payload": {"id": 8, "email": RAW, "ok": True}}
    letters = _letters([
        (b'{"id":7}', json.dumps(envelope).encode()),
        (b'{"id":8}', json.dumps(wrapped).encode()),
        (b'{"other":1}', b'{"email": "' + RAW.encode() + b'" not json'),
        (b"\xff" + RAW.encode(), None),
        (None, b'{"name":"x"}'),
    ])
    out = masks.applied(letters).to_pylist()
    first = json.loads(out[0]["raw_value"])
    assert first["before"] == {"id": _sha("7"), "email": _sha(RAW), "name": "n"}
    assert first["after"] == {"id": _sha("7"), "email": None, "name": "m"}
    assert first["source"] == {"list": [{"email": _sha(RAW)}]}
    assert json.loads(out[0]["raw_key"]) == {"id": _sha("7")}
    assert json.loads(out[1]["raw_value"])["payload"] == {"id": _sha("8"), "email": _sha(RAW), "ok": True}
    assert json.loads(out[1]["raw_value"])["schema"] == wrapped["schema"]
    assert out[0]["error"] == "reason; dead letter: masked columns' values replaced by their masked form"
    assert out[2]["raw_key"] == b'{"other":1}' and out[2]["raw_value"] is None
    assert out[2]["error"].startswith("reason; dead letter: value dropped (not decodable JSON")
    assert out[3]["raw_key"] is None and "key dropped" in out[3]["error"]
    assert (out[4]["raw_key"], out[4]["raw_value"], out[4]["error"]) == (None, b'{"name":"x"}', "reason")
    assert all(RAW not in str(row) for row in out)
    assert [(r["topic"], r["offset"], r["stage"]) for r in out] == [("t", i, "decode") for i in range(5)]


def test_the_masked_form_is_the_tables(spark) -> None:
    """Text, integers and booleans hash as Spark's sha2(concat(salt, CAST(v AS STRING)), 256) does."""
    masks = DeadLetterMasks(["v"], SALT)
    values = [RAW, "é ü", 42, -(2**63), True, False]
    for value in values:
        literal = json.dumps(value) if type(value) is str else str(value).lower()
        expected = spark.sql(f"SELECT sha2(concat('{SALT}', CAST({literal} AS STRING)), 256) AS h").first()["h"]
        assert masks.masked(value) == expected, value
