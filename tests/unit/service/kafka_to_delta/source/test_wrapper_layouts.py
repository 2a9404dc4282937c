"""`wrapper_layouts.Layouts.split`: a chunk's values sorted into the schema versions of its range and cut open as
bytes; a value that looks wrapped but whose layout cannot be confirmed, or one beyond `MAX_LAYOUTS` versions, is
odd; a value without a wrapper is bare."""

from __future__ import annotations

import json

from service.kafka_to_delta.formats.debezium_json import JsonDocuments
from service.kafka_to_delta.source.wrapper_layouts import BARE, MAX_LAYOUTS, ODD, Layouts


def _schema(columns: list[str]) -> dict:
    image = {"type": "struct", "optional": True,
             "fields": [{"field": name, "type": "int64", "optional": name != "id"} for name in columns]}
    return {"type": "struct", "fields": [{**image, "field": "before"}, {**image, "field": "after"},
                                         {"field": "op", "type": "string"}]}


def _payload(key: int) -> dict:
    return {"before": None, "after": {"id": key}, "op": "c"}


def _wrapped(columns: list[str], key: int, separators=(",", ":"), payload_first: bool = False) -> bytes:
    body = {"schema": _schema(columns), "payload": _payload(key)}
    if payload_first:
        body = {"payload": body["payload"], "schema": body["schema"]}
    return json.dumps(body, separators=separators).encode()


def test_values_of_several_layouts_are_cut_to_their_payloads() -> None:
    values = [_wrapped(["id"], 1), _wrapped(["id", "n"], 2, (", ", ": ")), b'{"before":null,"after":{"id":3},"op":"c"}',
              _wrapped(["id"], 4), b'  ' + _wrapped(["id", "n"], 5, payload_first=True), _wrapped(["id", "n"], 6, (", ", ": "))]
    layouts = Layouts(JsonDocuments())
    groups, payloads = layouts.split(values)
    assert len(layouts.known) == 3
    assert groups.tolist() == [0, 1, BARE, 0, 2, 1]
    assert [json.loads(payload) for payload in payloads] == [_payload(key) for key in range(1, 7)]
    assert payloads[2] is values[2]  # a bare value is its own payload
    again, _ = layouts.split([_wrapped(["id", "n"], 7, (", ", ": "))])  # a later chunk: the layouts are known
    assert again.tolist() == [1] and len(layouts.known) == 3


def test_a_value_that_looks_wrapped_but_cannot_be_confirmed_is_odd_alone() -> None:
    broken = b'{"schema":' + json.dumps(_schema(["id"])).encode() + b',"payload":{"op":"c"'  # not JSON
    values = [broken, _wrapped(["id"], 1), b'{"payload":null}']
    groups, payloads = Layouts(JsonDocuments()).split(values)
    assert groups.tolist() == [ODD, 0, ODD]
    assert json.loads(payloads[1]) == _payload(1)


def test_beyond_max_layouts_the_values_of_new_versions_are_odd() -> None:
    versions = [[f"c{i}" for i in range(count)] + ["id"] for count in range(MAX_LAYOUTS + 3)]
    values = [_wrapped(columns, key) for key, columns in enumerate(versions)] + [b'{"id":1}']
    layouts = Layouts(JsonDocuments())
    groups, _ = layouts.split(values)
    assert groups.tolist() == [*range(MAX_LAYOUTS), ODD, ODD, ODD, BARE]
    assert len(layouts.known) == MAX_LAYOUTS
