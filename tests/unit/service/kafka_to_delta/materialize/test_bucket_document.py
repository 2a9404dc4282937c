"""A bucket's stored keys as Arrow columns (`bucket_document`) against a dict of the same keys.

Random sequences of what the bucket stage does to a document (look up the touched keys, replace
them with their new states, expire by TTL, store and read back) must leave exactly what a plain
dict does. Fixed seeds, plus hypothesis's own search (derandomised, so every run tries the same
examples)."""

from __future__ import annotations

import random

import orjson
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.kafka_to_delta.materialize.bucket_document import (
    BucketDocument,
    decode_bucket,
    encode_bucket,
)
from tests.support.run_seed import run_seed

SEEDS = [0, 1, 2, 3, 17, 2024]
TTL_MS = 1_000


def _model_expire(states: dict, ttl_ms: int, watermark: int) -> int:
    gone = [k for k, (_, touched) in states.items() if touched is not None and touched + ttl_ms <= watermark]
    for key in gone:
        del states[key]
    return len(gone)


def _model_next_expiry(states: dict, ttl_ms: int) -> int | None:
    return min((t + ttl_ms for _, t in states.values() if t is not None), default=None)


def _run(rnd: random.Random, ttl_ms: int) -> None:
    keys = [orjson.dumps([i]).decode() for i in range(rnd.randint(1, 60))] + ['["ü",1]', '[""]']
    model: dict = {}
    document = BucketDocument()
    for step in range(rnd.randint(1, 25)):
        touched = set(rnd.sample(keys, rnd.randint(0, len(keys))))
        assert document.take(touched) == {k: v for k, v in model.items() if k in touched}
        new = {k: (f"state {step} {k}", rnd.randint(0, 5_000) if ttl_ms else None)
               for k in touched if rnd.random() < 0.7}
        document.replace(touched, new)
        for key in touched:
            model.pop(key, None)
        model.update(new)
        if rnd.random() < 0.5:
            watermark = rnd.randint(0, 7_000)
            assert document.expire(ttl_ms, watermark) == (_model_expire(model, ttl_ms, watermark) if ttl_ms else 0)
        assert document.next_expiry(ttl_ms) == (_model_next_expiry(model, ttl_ms) if ttl_ms else None)
        if rnd.random() < 0.5:
            document = BucketDocument.read(document.to_bytes())
        assert len(document) == len(model) and document.states() == model


@pytest.mark.parametrize("ttl_ms", [0, TTL_MS])
@pytest.mark.parametrize("seed", [*SEEDS, run_seed(2**32)])
def test_the_document_holds_what_a_dict_of_the_same_keys_holds(seed, ttl_ms):
    _run(random.Random(seed), ttl_ms)  # the random seed is in the test id when it fails


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([0, TTL_MS]))
def test_the_document_holds_what_a_dict_holds_under_hypothesis(seed, ttl_ms):
    _run(random.Random(seed), ttl_ms)


def test_documents_of_every_layout_read_the_same():
    states = {'["a"]': ('{"v":1,"l":[]}', 5), '["b"]': ('{"v":1,"l":[]}', None)}
    plain = orjson.dumps(states)
    zstd_json = b"\x01" + len(plain).to_bytes(8, "little") + pa.Codec("zstd").compress(plain, asbytes=True)
    for blob in (plain, zstd_json, encode_bucket(states)):
        assert decode_bucket(blob) == states
    assert encode_bucket(states)[:1] == b"\x02"
    assert decode_bucket(None) == {} and decode_bucket(b"") == {}
    assert len(BucketDocument.read(encode_bucket({}))) == 0


def test_a_document_stays_one_batch_of_columns_however_often_it_is_rewritten():
    document = BucketDocument()
    for step in range(30):
        document.replace({f"[{step}]"}, {f"[{step}]": ("s", None)})
        document = BucketDocument.read(document.to_bytes())
    assert document.table.column("key").num_chunks == 1 and len(document) == 30
