"""The common-shape state text on columns (`key_state_columns`) and row digests from a column's buffer
(`row_digest.row_digests`) against their record-by-record counterparts (`one_row_state`, `stored_row`,
`row_digest`), on random texts: quotes, backslashes, every control character, non-ASCII, empty texts, nulls,
sliced and large-string columns. Fixed seeds, plus one random seed (in the test id)."""

from __future__ import annotations

import random

import numpy as np
import orjson
import pyarrow as pa
import pytest

from service.kafka_to_delta.materialize.key_state import LiveRow, PkState, Tombstone, encode_state, one_row_state
from service.kafka_to_delta.materialize.key_state_columns import StoredRows, escaped, one_row_states
from service.kafka_to_delta.materialize.row_digest import row_digest, row_digests
from service.kafka_to_delta.materialize.rules_fast import stored_row
from tests.support.run_seed import run_seed

SEEDS = [0, 1, 3, 17, 256]
_ALPHABET = ['"', "\\", "/", "a", "Z", "0", " ", "é", "\u2028", "\x7f", "😀", *map(chr, range(0x20))]


def _text(rnd: random.Random) -> str:
    return "".join(rnd.choice(_ALPHABET) for _ in range(rnd.randint(0, 12)))


def _texts(rnd: random.Random, count: int, nulls: bool = True) -> list[str | None]:
    return [None if nulls and rnd.random() < 0.1 else _text(rnd) for _ in range(count)]


@pytest.mark.parametrize("seed", [*SEEDS, run_seed(2**32)])
def test_escaped_texts_are_orjsons_strings(seed):
    texts = _texts(random.Random(seed), 200)
    expected = [None if text is None else orjson.dumps(text).decode()[1:-1] for text in texts]
    assert escaped(pa.array(texts, pa.string())).to_pylist() == expected, f"seed {seed}"
    plain = [text.replace("\\", "").replace('"', "") for text in texts if text is not None and text.isprintable()]
    assert escaped(pa.array(plain, pa.string())).to_pylist() == plain  # nothing to escape: left as it is


@pytest.mark.parametrize("seed", [*SEEDS, run_seed(2**32)])
def test_new_states_are_one_row_states_and_read_back(seed):
    rnd = random.Random(seed)
    count = 100
    keys, rows, topics = _texts(rnd, count), _texts(rnd, count), _texts(rnd, count, nulls=False)
    partitions = [rnd.randint(0, 2**31 - 1) for _ in range(count)]
    offsets = [rnd.choice([0, rnd.randint(0, 2**62)]) for _ in range(count)]
    states = one_row_states(pa.array(keys, pa.string()), escaped(pa.array(rows, pa.string())),
                            pa.array(topics, pa.string()),
                            pa.array(partitions, pa.int32()), pa.array(offsets, pa.int64())).to_pylist()
    for state, key, row, position in zip(states, keys, rows, zip(topics, partitions, offsets)):
        assert state == (None if key is None or row is None else one_row_state(key, row, position)), f"seed {seed}"
    read = StoredRows(pa.array(states, pa.string()))
    for state, matched, row, key in zip(states, read.matched.to_pylist(), read.row.to_pylist(),
                                        read.upsert_key.to_pylist()):
        assert matched == (state is not None)
        if state is not None:
            common, live = stored_row(state, orjson.loads(f'"{key}"'))
            assert common and live is not None and live[0] == orjson.loads(f'"{row}"'), f"seed {seed}"


def test_only_the_common_layout_is_read():
    position = ("t", 0, 5)
    kept = one_row_state('["k"]', '{"id":"k"}', position)
    others = [
        encode_state(PkState([LiveRow('["k"]', '{"id":"k"}', position)], {'["o"]': Tombstone((1,), position, 9)})),
        encode_state(PkState([LiveRow('["k"]', '{"id":"k"}', position, sequence=(3,))])),
        encode_state(PkState([LiveRow('["k"]', "a", position), LiveRow('["k"]', "b", position)])),
        encode_state(PkState([LiveRow('{"id":"k"}', '{"id":"k"}', position, key_mode="whole_row")])),
        orjson.dumps(orjson.loads(kept), option=orjson.OPT_INDENT_2).decode(),  # the rules read it; not this
        kept.replace('"v":1', '"v":2'),
        kept.replace(",5]", ",5.0]"),
        '{"v":1,"l":[]}',
        "not json",
    ]
    read = StoredRows(pa.array([kept, None, *others], pa.string()))
    assert read.matched.to_pylist() == [True, False, *[False] * len(others)]
    assert read.row.to_pylist()[0] == '{\\"id\\":\\"k\\"}' and read.upsert_key.to_pylist()[0] == '[\\"k\\"]'


@pytest.mark.parametrize("seed", [*SEEDS, run_seed(2**32)])
@pytest.mark.parametrize("large", [False, True])
def test_row_digests_from_the_buffer_are_row_digests(seed, large):
    rnd = random.Random(seed)
    rows = [None if rnd.random() < 0.1 else _text(rnd) * rnd.choice([1, 50, 400]) for _ in range(120)]
    column = pa.array(rows, pa.large_string() if large else pa.string()).slice(7, 100)
    chosen = np.array([rnd.random() < 0.7 for _ in range(100)])
    expected = [row_digest(row) if ok and row is not None else None for row, ok in zip(rows[7:107], chosen)]
    assert row_digests(column, chosen).to_pylist() == expected, f"seed {seed}"
    assert row_digests(column, np.zeros(100, np.bool_)).null_count == 100
