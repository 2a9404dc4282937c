"""The export benchmark's tables: row generators of one Delta schema per shape.

- `simple`: id, a name, a float amount, a flag.
- `realistic`: the Delta types a real Debezium capture of PostgreSQL lands in
  (`testbed/realistic_capture.py`'s `accounts` table): id, email, revision, balance
  decimal(12,2), updated_at timestamp (UTC), birthday date, profile (jsonb as text), external_id
  (uuid as text), status (an enum as text), tags array<string>, notes (a TOASTed text: a
  quarter of the rows hold 2,100-3,200 characters, the rest 10-120). About 10 % of birthday,
  profile and tags are null. Values come from numpy generators seeded per commit version, so
  a million rows build in seconds; notes are drawn from a pool of distinct texts.
"""

from __future__ import annotations

import json
import string
from typing import Callable

import numpy as np
import pyarrow as pa

SIMPLE = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64()), ("active", pa.bool_())])
REALISTIC = pa.schema([
    ("id", pa.int64()), ("email", pa.string()), ("revision", pa.int64()), ("balance", pa.decimal128(12, 2)),
    ("updated_at", pa.timestamp("us", tz="UTC")), ("birthday", pa.date32()), ("profile", pa.string()),
    ("external_id", pa.string()), ("status", pa.string()), ("tags", pa.list_(pa.string())), ("notes", pa.string()),
])
STATUSES = ("new", "active", "suspended", "closed")
TAGS = ("vip", "b2b", "trial", "churn-risk", "größe", "🏷", "o'neil", "beta")
NULL_SHARE = 0.1
LARGE_NOTES_SHARE = 0.25
LARGE_NOTES_CHARS = (2_100, 3_200)
SMALL_NOTES_CHARS = (10, 120)
NOTES_POOL = 4_096
_US_2020 = 1_577_836_800 * 10**6
_US_SPAN = 2 * 10**14
_ALPHABET = np.frombuffer((string.ascii_letters + string.digits + " ").encode("ascii"), dtype=np.uint8)


def simple_rows(ids: list[int], version: int) -> pa.Table:
    """Rows of the simple shape."""
    return pa.table({
        "id": ids, "name": [f"v{version}-{i}" for i in ids], "amount": [i * 0.25 + version for i in ids],
        "active": [(i + version) % 2 == 0 for i in ids],
    }, schema=SIMPLE)


def _notes_pool(rng: np.random.Generator) -> list[str]:
    large = rng.random(NOTES_POOL) < LARGE_NOTES_SHARE
    lengths = np.where(large, rng.integers(*LARGE_NOTES_CHARS, NOTES_POOL, endpoint=True),
                       rng.integers(*SMALL_NOTES_CHARS, NOTES_POOL, endpoint=True))
    letters = _ALPHABET[rng.integers(0, len(_ALPHABET), int(lengths.sum()))].tobytes().decode("ascii")
    ends = np.cumsum(lengths)
    return [letters[end - length:end] for end, length in zip(ends.tolist(), lengths.tolist())]


def _with_nulls(values: pa.Array, rng: np.random.Generator) -> pa.Array:
    mask = pa.array(rng.random(len(values)) < NULL_SHARE)
    return pa.compute.if_else(mask, pa.nulls(len(values), values.type), values)


def realistic_rows(ids: list[int], version: int) -> pa.Table:
    """Rows of the realistic shape; the same ids and version give the same rows."""
    rng = np.random.default_rng(version)
    count = len(ids)
    keys = np.asarray(ids, dtype=np.int64)
    cents = rng.integers(-10**11 + 1, 10**11, count)
    unscaled = np.stack([cents, np.where(cents < 0, -1, 0)], axis=1).astype("<i8")  # int128, little-endian
    balance = pa.Array.from_buffers(pa.decimal128(12, 2), count, [None, pa.py_buffer(unscaled.tobytes())])
    stamps = pa.array(_US_2020 + rng.integers(0, _US_SPAN, count), pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    days = pa.array(rng.integers(-15_000, 15_000, count).astype(np.int32), pa.int32()).cast(pa.date32())
    plans = np.array(["free", "pro", "team"])[rng.integers(0, 3, count)]
    cities = np.array(["Oslo", "Łódź", "São Paulo"])[rng.integers(0, 3, count)]
    profile = [json.dumps({"plan": p, "score": int(s), "flags": {"beta": bool(b)}, "city": c})
               for p, s, b, c in zip(plans, rng.integers(0, 1000, count), rng.random(count) < 0.3, cities)]
    uuids = rng.integers(0, 256, (count, 16), dtype=np.uint8)
    hexes = [row.tobytes().hex() for row in uuids]
    external = [f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}" for h in hexes]
    sizes = rng.integers(0, 4, count)
    tags = pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)),
                                    pa.array(np.array(TAGS)[rng.integers(0, len(TAGS), int(sizes.sum()))]))
    notes = np.array(_notes_pool(rng), dtype=object)[rng.integers(0, NOTES_POOL, count)]
    return pa.table({
        "id": keys, "email": [f"u{i}.{version}@example.com" for i in ids], "revision": np.full(count, version - 1),
        "balance": balance, "updated_at": stamps, "birthday": _with_nulls(days, rng),
        "profile": _with_nulls(pa.array(profile), rng), "external_id": external,
        "status": np.array(STATUSES)[rng.integers(0, len(STATUSES), count)],
        "tags": _with_nulls(tags, rng), "notes": pa.array(notes, pa.string()),
    }, schema=REALISTIC)


SHAPES: dict[str, tuple[pa.Schema, Callable[[list[int], int], pa.Table]]] = {
    "simple": (SIMPLE, simple_rows), "realistic": (REALISTIC, realistic_rows),
}
