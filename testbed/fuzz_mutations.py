"""The mutations of the decoder fuzz (`testbed.fuzz_records`): one is drawn per record, by weight.

A mutation works on the record's bytes (any format), on its Confluent Avro frame, or on its JSON
document (the payload, inside the Connect wrapper when there is one). It returns False when it
does not apply to the record (e.g. a document mutation of a tombstone); another is drawn then.
"""

from __future__ import annotations

import copy
import json
from typing import Callable

from connectors.schema_registry.errors import AvroEncodeError
from connectors.schema_registry.wire_format import HEADER_SIZE, frame, split_frame
from service.operations.workload import Event
from testbed.fuzz_documents import (
    DEEP,
    DOCUMENT_MUTATIONS,
    UNKNOWN_OPS,
    Draft,
    MutationContext,
    dumps,
)

NONE = "none"
UNKNOWN_SCHEMA_IDS = (987_654, 2**32 - 1, 77)
UNUSABLE_SUBJECT = "fuzz-unusable"
INVALID_UTF8 = (b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xe2\x82", b"\xf8\x88\x80\x80\x80", b"\x80")
BAD_KEYS = (b"", b"\xff\xfe", b"[1,2]", b'{"id":null}', b'{"other":1}', b'"x"', b"{", b"null", b'{"id":"\\ud800"}',
            b'{"id":1e400}', b'{"id":"abc"}')


# --- bytes ---------------------------------------------------------------------------------


def _truncated(c: MutationContext, d: Draft) -> bool:
    if not d.value:
        return False
    d.value = d.value[: c.rng.randrange(len(d.value))]
    return True


def _invalid_utf8(c: MutationContext, d: Draft) -> bool:
    if not d.value:
        return False
    bad = c.rng.choice(INVALID_UTF8)
    inside = d.value.find(b'"name":"')
    at = inside + 8 if inside >= 0 and c.rng.random() < 0.5 else c.rng.randrange(len(d.value))
    d.value = d.value[:at] + bad + d.value[at + (len(bad) if c.rng.random() < 0.5 else 0):]
    return True


def _bit_flip(c: MutationContext, d: Draft) -> bool:
    if not d.value:
        return False
    value = bytearray(d.value)
    for _ in range(c.rng.randrange(1, 5)):
        value[c.rng.randrange(len(value))] ^= 1 << c.rng.randrange(8)
    d.value = bytes(value)
    return True


def _appended_garbage(c: MutationContext, d: Draft) -> bool:
    if d.value is None:
        return False
    d.value += c.rng.choice([b" ", b"}", b"\x00", c.rng.randbytes(c.rng.randrange(1, 16))])
    return True


def _wrong_magic_byte(c: MutationContext, d: Draft) -> bool:
    if not d.value:
        return False
    d.value = bytes([c.rng.choice([b for b in range(256) if b != d.value[0]])]) + d.value[1:]
    return True


def _set_value(value: bytes | None) -> Callable[[MutationContext, Draft], bool]:
    def mutation(c: MutationContext, d: Draft) -> bool:
        d.value = value
        return True

    return mutation


def _null_key(c: MutationContext, d: Draft) -> bool:
    d.key = None
    return True


def _bad_key(c: MutationContext, d: Draft) -> bool:
    d.key = c.rng.choice(BAD_KEYS + (c.rng.randbytes(c.rng.randrange(1, 40)),))
    return True


def _huge_key(c: MutationContext, d: Draft) -> bool:
    d.key = c.rng.choice([b'{"id":' + b"1" * 100_000 + b"}", b'{"id":"' + b"k" * 200_000 + b'"}'])
    return True


# --- Avro frames ---------------------------------------------------------------------------


def _reframed(schema_id: Callable[[MutationContext], int]) -> Callable[[MutationContext, Draft], bool]:
    def mutation(c: MutationContext, d: Draft) -> bool:
        if d.value is None:
            return False
        _, body = split_frame(d.value)
        d.value = frame(schema_id(c), bytes(body))
        return True

    return mutation


def _short_frame(c: MutationContext, d: Draft) -> bool:
    if d.value is None:
        return False
    d.value = d.value[: c.rng.randrange(HEADER_SIZE)]
    return True


def _avro_document(c: MutationContext, d: Draft, change: Callable[[dict], None]) -> bool:
    """Re-encode the record's payload after `change`; False when the result does not fit the schema."""
    if d.document is None:
        return False
    payload = copy.deepcopy(d.document)
    change(payload)
    try:
        d.value = c.avro.encode(Event("", 0, d.key or b"", dumps(payload))).value
    except AvroEncodeError:
        return False
    return True


def _avro_invalid_string(c: MutationContext, d: Draft) -> bool:
    after = (d.document or {}).get("after")
    if not isinstance(after, dict) or not _avro_document(c, d, lambda p: p["after"].update(name="Z" * 8)):
        return False
    d.value = d.value.replace(b"Z" * 8, c.rng.choice([b"\xff" * 8, b"abc\xed\xa0\x80de", b"\xc3\x28" * 4]), 1)
    return True


def _avro_op(c: MutationContext, d: Draft) -> bool:
    choice = c.rng.randrange(3)
    if choice == 0:
        return _avro_document(c, d, lambda p: p.update(op=c.rng.choice(UNKNOWN_OPS)))
    side = "before" if (d.document or {}).get("op") == "d" else "after"
    if choice == 1:
        return _avro_document(c, d, lambda p: p.update({side: None}))
    if d.document is None or not isinstance(d.document.get(side), dict):
        return False
    return _avro_document(c, d, lambda p: p[side].update(name=c.rng.choice(["", "x" * 100_000, "\u00e9\u4e2d"])))


Mutation = Callable[[MutationContext, Draft], bool]
# name -> (weight, where it applies: "any", "avro", "json"), mutation
MUTATIONS: dict[str, tuple[int, str, Mutation | None]] = {
    NONE: (10, "any", None),
    "truncated": (6, "any", _truncated),
    "invalid-utf8": (6, "any", _invalid_utf8),
    "bit-flip": (5, "any", _bit_flip),
    "empty-value": (2, "any", _set_value(b"")),
    "appended-garbage": (3, "any", _appended_garbage),
    "wrong-magic-byte": (3, "any", _wrong_magic_byte),
    "null-value": (3, "any", _set_value(None)),
    "null-key": (5, "any", _null_key),
    "bad-key": (4, "any", _bad_key),
    "huge-key": (1, "any", _huge_key),
    "unknown-schema-id": (6, "avro", _reframed(lambda c: c.rng.choice(UNKNOWN_SCHEMA_IDS))),
    "short-frame": (3, "avro", _short_frame),
    "unusable-schema-id": (2, "avro", _reframed(lambda c: c.registry.register(UNUSABLE_SUBJECT, '"string"'))),
    "other-schema-id": (2, "avro", _reframed(lambda c: c.avro.keys.schema_id)),
    "avro-invalid-utf8-string": (4, "avro", _avro_invalid_string),
    "avro-op-or-image": (6, "avro", _avro_op),
    **DOCUMENT_MUTATIONS,
}


def _applies(where: str, c: MutationContext) -> bool:
    return where == "any" or (where == "avro") == (c.avro is not None)


def mutate(c: MutationContext, event: Event) -> tuple[str, bytes | None, bytes | None]:
    """(mutation name, key, value) of one valid event, mutated."""
    names = [name for name, (_, where, _) in MUTATIONS.items() if _applies(where, c) and name not in c.excluded]
    weights = [MUTATIONS[name][0] for name in names]
    while True:
        name = c.rng.choices(names, weights)[0]
        draft = _draft(c, event)
        mutation = MUTATIONS[name][2]
        if mutation is None or mutation(c, draft):
            return name, draft.key, _encoded(c, draft)


def _draft(c: MutationContext, event: Event) -> Draft:
    draft = Draft(event.key, event.value)
    if event.value is None:
        return draft
    document = json.loads(event.value)
    if c.schema_block:
        draft.wrapper, document = document, document["payload"]
    draft.document = document
    if c.avro is not None:
        draft.value = c.avro.encode(event).value
    return draft


def _encoded(c: MutationContext, d: Draft) -> bytes | None:
    """The value bytes: a mutated JSON document is encoded again (in its wrapper)."""
    if not d.reencode:
        return d.value
    text = dumps(d.document if d.wrapper is None else {**d.wrapper, "payload": d.document})
    if d.deep:
        text = text.replace(dumps(DEEP), b"[" * d.deep + b"]" * d.deep, 1)
    return text
