"""JSON document mutations of the decoder fuzz: the record's payload (or its Connect wrapper) is
changed as a document, then encoded again (`Draft.reencode`). See `testbed.fuzz_mutations`."""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass
from typing import Any, Callable

DEEP = "__fuzz_deep__"  # replaced by nested lists after encoding (json.dumps would recurse)
DEPTHS = (20, 300, 900, 990, 1010, 1100, 5000)
WRONG_VALUES: tuple[Any, ...] = (0, -1, 1.5, True, False, "x", "", [], {}, [1, "a"], {"a": 1}, None)
HUGE_NUMBERS = (2**63, -(2**63) - 1, 10**19, 10**40, -(10**40), 1e308, -1e308, 5e-324, 2**53 + 1)
NON_FINITE = (float("nan"), float("inf"), float("-inf"))
UNKNOWN_OPS = ("z", "", "C", "insert", " c", "t", "m", "x" * 40, "\u0000", "UPDATE")
EVENT_TIMES: tuple[Any, ...] = ("x", "2024-02-30T00:00:00Z", "2024-01-01T00:00:00Z", None, 10**30, 1e300, -1e300,
                                float("inf"), float("nan"), [], {}, True)
SURROGATES = ("\ud800abc", "x\udfff", "\udc00")
NOT_OBJECTS: tuple[Any, ...] = ([], [1, 2], "text", 17, 2.5, True, None)
STRING_COLUMNS = ("name", "email")
IMAGES = ("after", "before")


@dataclass
class Draft:
    """A record being mutated: bytes, or the JSON payload (inside `wrapper`) when `reencode` is set."""

    key: bytes | None
    value: bytes | None
    document: Any = None
    wrapper: dict | None = None
    deep: int = 0
    reencode: bool = False


class MutationContext:
    """What mutations need besides the record: random source, format and Avro encoder."""

    def __init__(self, rng: random.Random, fmt: str, schema_block: bool, avro: Any, registry: Any,
                 excluded: frozenset[str] = frozenset()) -> None:
        self.rng, self.fmt, self.schema_block, self.avro, self.registry = rng, fmt, schema_block, avro, registry
        self.excluded = excluded  # mutation names not to draw

    @property
    def envelope(self) -> bool:
        """Row images sit in before/after (not a flat record)."""
        return self.fmt != "flat"


def dumps(document: Any) -> bytes:
    """Compact JSON as the workload writes it (NaN and Infinity as bare tokens, like Python does)."""
    return json.dumps(document, separators=(",", ":")).encode()


def _columns(c: MutationContext, d: Draft) -> list[tuple[str, ...]]:
    """Paths of the row columns of the document."""
    if not c.envelope:
        return [(name,) for name in d.document if name != "op"]
    return [(image, name) for image in IMAGES if isinstance(d.document.get(image), dict)
            for name in d.document[image]]


def _envelope_fields(c: MutationContext, d: Draft) -> list[tuple[str, ...]]:
    return [(name,) for name in d.document] if c.envelope else [("op",)]


def _document(mutation: Callable[[MutationContext, Draft], bool]) -> Callable[[MutationContext, Draft], bool]:
    """A document mutation: applies to records with a JSON object payload, re-encodes it."""
    def apply(c: MutationContext, d: Draft) -> bool:
        if c.avro is not None or not isinstance(d.document, dict):
            return False
        d.document = copy.deepcopy(d.document)
        d.reencode = True
        return mutation(c, d)

    return apply


def _set(document: dict, path: tuple[str, ...], value: Any) -> None:
    for name in path[:-1]:
        if not isinstance(document.get(name), dict):
            document[name] = {}
        document = document[name]
    document[path[-1]] = value


def _pick(c: MutationContext, paths: list[tuple[str, ...]]) -> tuple[str, ...] | None:
    return c.rng.choice(paths) if paths else None


@_document
def _wrong_type(c: MutationContext, d: Draft) -> bool:
    path = _pick(c, _envelope_fields(c, d) + _columns(c, d))
    if path is None:
        return False
    _set(d.document, path, c.rng.choice(WRONG_VALUES))
    return True


@_document
def _missing_field(c: MutationContext, d: Draft) -> bool:
    path = _pick(c, _envelope_fields(c, d) + _columns(c, d))
    if path is None:
        return False
    parent = d.document if len(path) == 1 else d.document[path[0]]
    del parent[path[-1]]
    return True


@_document
def _unknown_op(c: MutationContext, d: Draft) -> bool:
    d.document["op"] = c.rng.choice(UNKNOWN_OPS)
    return True


def _column_value(values: Callable[[MutationContext], Any], only: tuple[str, ...] | None = None,
                  also: tuple[tuple[str, ...], ...] = ()) -> Callable[[MutationContext, Draft], bool]:
    """Set one row column (of the names in `only`, when given) or one of the `also` paths."""
    @_document
    def mutation(c: MutationContext, d: Draft) -> bool:
        paths = [p for p in _columns(c, d) if only is None or p[-1] in only] + list(also)
        path = _pick(c, paths)
        if path is None:
            return False
        _set(d.document, path, values(c))
        return True

    return mutation


@_document
def _deep_nesting(c: MutationContext, d: Draft) -> bool:
    d.deep = c.rng.choice(DEPTHS)
    path = _pick(c, _columns(c, d) + [("op",), ("ts_ms",)])
    _set(d.document, path or ("op",), DEEP)
    return True


@_document
def _many_columns(c: MutationContext, d: Draft) -> bool:
    image = d.document.get("after") if c.envelope else d.document
    if not isinstance(image, dict):
        return False
    image.update({f"c{i}": i for i in range(c.rng.choice([500, 3000]))})
    return True


@_document
def _not_an_object(c: MutationContext, d: Draft) -> bool:
    d.document = c.rng.choice(NOT_OBJECTS)
    return True


@_document
def _keyless_delete(c: MutationContext, d: Draft) -> bool:
    """A delete whose row image is gone: the Kafka key (maybe broken too) has to stand in."""
    if d.document.get("op") not in ("d", "DELETE"):
        return False
    if c.envelope:
        d.document["before"] = None
    else:
        d.document = {"op": "DELETE"}
    if c.rng.random() < 0.5:
        d.key = c.rng.choice([None, b"", b"\xff", b'{"id":null}', b'{"x":1}', b"[1]", b'{"id":"s"}', b'{"id":1.5}'])
    return True


def _schema_block(c: MutationContext, d: Draft) -> bool:
    """A broken Connect wrapper: its schema, its payload key, or a field type; encoded here."""
    if d.wrapper is None or d.document is None:
        return False
    wrapper = copy.deepcopy(d.wrapper)
    choice = c.rng.randrange(4)
    if choice == 0:
        wrapper["schema"] = c.rng.choice(["x", {}, None, [], {"type": "struct"}, {"type": "struct", "fields": "x"}])
    elif choice == 1:
        fields = [f for f in wrapper["schema"]["fields"] if f.get("field") == "after"][0]["fields"]
        c.rng.choice(fields)["type"] = c.rng.choice(["foo", "int8", "boolean", "bytes", 7])
    if choice == 2:
        d.value = dumps({"schema": wrapper["schema"]})
    elif choice == 3:
        d.value = dumps({**wrapper, "payload": d.document, "extra": 1})
    else:
        d.value = dumps({**wrapper, "payload": d.document})
    return True


@_document
def _event_time(c: MutationContext, d: Draft) -> bool:
    if c.fmt != "debezium":
        return False
    d.document["ts_ms"] = c.rng.choice(EVENT_TIMES)
    return True


DOCUMENT_MUTATIONS: dict[str, tuple[int, str, Callable[[MutationContext, Draft], bool]]] = {
    "wrong-type": (10, "json", _wrong_type),
    "missing-field": (6, "json", _missing_field),
    "unknown-op": (5, "json", _unknown_op),
    "huge-string": (2, "json", _column_value(lambda c: "x" * c.rng.choice([10_000, 100_000, 300_000]),
                                             STRING_COLUMNS)),
    "huge-number": (4, "json", _column_value(lambda c: c.rng.choice(HUGE_NUMBERS), also=(("ts_ms",),))),
    "non-finite": (3, "json", _column_value(lambda c: c.rng.choice(NON_FINITE), also=(("ts_ms",),))),
    "deep-nesting": (3, "json", _deep_nesting),
    "lone-surrogate": (4, "json", _column_value(lambda c: c.rng.choice(SURROGATES),
                                                also=(("op",), ("source", "snapshot")))),
    "many-columns": (1, "json", _many_columns),
    "not-an-object": (3, "json", _not_an_object),
    "keyless-delete": (4, "json", _keyless_delete),
    "schema-block": (6, "json", _schema_block),
    "event-time": (5, "json", _event_time),
}
"""name -> (weight, where it applies, mutation)."""
