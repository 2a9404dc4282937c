"""The known-schema shortcut gives exactly what a full parse gives, or steps aside."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from service.kafka_to_delta.formats.connect_wrapper import PAYLOAD_SEPARATOR, KnownSchemas

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "payload", "schema", "x"]),
                                                                 inner, max_size=3),
    max_leaves=10,
)


COMPACT = {"separators": (",", ":")}
LAYOUTS = [COMPACT, {}, {"indent": 1}, {"indent": "\t", "separators": (" ,", " : ")}]  # all valid JSON


def _wrap(schema, payload, layout=COMPACT) -> bytes:
    return json.dumps({"schema": schema, "payload": payload}, **layout).encode()


def test_known_schema_skips_to_the_payload():
    known = KnownSchemas(json.loads)
    schema = {"type": "struct", "fields": [{"field": "after", "type": "struct"}]}
    first = _wrap(schema, {"op": "c"})
    assert known.split(first) is None
    known.learn(first, schema, "types-1")
    assert known.split(_wrap(schema, {"op": "u", "after": {"id": 1}})) == ({"op": "u", "after": {"id": 1}}, "types-1")
    assert known.split(_wrap(schema, None)) == (None, "types-1")
    assert known.split(_wrap({**schema, "version": 2}, {"op": "c"})) is None


def test_payload_key_inside_the_schema_never_misleads():
    known = KnownSchemas(json.loads)
    schema = {"type": "struct", "parameters": {"doc": "x", "payload": "1"}, "fields": []}
    first = _wrap(schema, {"op": "c"})
    known.learn(first, schema, "t")  # the first ',"payload":' ends inside the schema: not learned
    assert known.split(first) is None
    assert known.split(_wrap({**schema, "name": "different"}, {"op": "d"})) is None
    quoted = {"type": "struct", "doc": ',"payload":', "fields": []}  # escaped quotes inside a string
    known.learn(_wrap(quoted, {"op": "c"}), quoted, "q")
    assert known.split(_wrap(quoted, {"op": "d"})) == ({"op": "d"}, "q")


def test_extra_top_level_keys_fall_back_to_a_full_parse():
    known = KnownSchemas(json.loads)
    schema = {"type": "struct"}
    known.learn(_wrap(schema, {"op": "c"}), schema, "t")
    odd = _wrap(schema, {"op": "c"})[:-1] + b',"extra":1}'
    assert known.split(odd) is None


def test_any_whitespace_between_the_tokens_is_learned():
    schema = {"type": "struct", "fields": [{"field": "after", "type": "struct"}]}
    for layout in LAYOUTS:
        known = KnownSchemas(json.loads)
        known.learn(_wrap(schema, {"op": "c"}, layout), schema, "types")
        later = _wrap(schema, {"op": "u", "after": {"id": 2}}, layout)
        assert known.split(later) == ({"op": "u", "after": {"id": 2}}, "types"), layout
        assert known.split(later + b"\n") == ({"op": "u", "after": {"id": 2}}, "types"), layout
        assert known.split(_wrap(schema, {"op": "d"}, COMPACT if layout is not COMPACT else {})) is None


@given(json_values, json_values, json_values, st.sampled_from(LAYOUTS))
def test_split_agrees_with_a_full_parse(schema, payload, later_payload, layout):
    known = KnownSchemas(json.loads)
    first = _wrap(schema, payload, layout)
    known.learn(first, json.loads(first)["schema"], "attached")
    later = _wrap(schema, later_payload, layout)
    split = known.split(later)
    schema_text = json.dumps(schema, **layout).encode()
    if PAYLOAD_SEPARATOR.search(schema_text) is None:
        assert split is not None, "the shortcut must apply when the schema bytes are unambiguous"
    if split is not None:
        assert split == (json.loads(later)["payload"], "attached")
