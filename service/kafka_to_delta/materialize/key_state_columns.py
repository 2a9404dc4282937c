"""The common-shape state text (`key_state.one_row_state`, read by `rules_fast.stored_row`) on Arrow columns.

A bucket call decides hundreds of keys on columns (`rules_columns`); parsing each stored state with orjson and
writing each new one in Python cost about a third of that call. Here both happen on whole columns: a new
state text is the winners' columns escaped as orjson escapes a string and joined with the layout's fixed
pieces, and a stored state is matched against that same layout with one regular expression. A stored state
in any other layout (a tombstone, a sequence, several rows, whitespace, a version to come) does not match,
and its key is left to the rules, which read any layout.

tests/unit/service/kafka_to_delta/materialize/test_key_state_columns.py holds both equal to their
record-by-record counterparts on random texts (quotes, backslashes, every control character, non-ASCII).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from service.kafka_to_delta.materialize.key_state import STATE_VERSION

_TEXT = r'(?:[^"\\]|\\.)*'  # the inside of a JSON string as orjson writes it
_STORED = (rf'^\{{"v":{STATE_VERSION},"l":\[\{{"r":"(?P<row>{_TEXT})","p":\["(?P<topic>{_TEXT})",'
           rf'(?P<partition>-?[0-9]+),(?P<offset>-?[0-9]+)\],"k":"(?P<upsert_key>{_TEXT})"\}}\]\}}$')
_CONTROL = "[\x00-\x1f]"
_SHORT_ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def escaped(texts: pa.Array) -> pa.Array:
    """Each text as it stands between the quotes of orjson's JSON string (null stays null)."""
    texts = pc.replace_substring(texts, "\\", "\\\\")
    texts = pc.replace_substring(texts, '"', '\\"')
    if not pc.any(pc.match_substring_regex(texts, _CONTROL)).as_py():
        return texts
    for code in range(0x20):
        character = chr(code)
        texts = pc.replace_substring(texts, character, _SHORT_ESCAPES.get(character, f"\\u{code:04x}"))
    return texts


def one_row_states(upsert_keys: pa.Array, escaped_rows: pa.Array, topics: pa.Array, partitions: pa.Array,
                   offsets: pa.Array) -> pa.Array:
    """`one_row_state` of each position's (upsert key, row, (topic, partition, offset)), the rows given as
    `escaped` writes them (the caller compares them with `StoredRows.row` too); null where any is."""
    pieces = [f'{{"v":{STATE_VERSION},"l":[{{"r":"', escaped_rows, '","p":["', escaped(topics), '",',
              pc.cast(partitions, pa.int64()).cast(pa.string()), ",", pc.cast(offsets, pa.int64()).cast(pa.string()),
              '],"k":"', escaped(upsert_keys), '"}]}']
    return pc.binary_join_element_wise(*pieces, "")


class StoredRows:
    """Stored states (null: none stored) read as the layout `one_row_states` writes: `matched` where a state
    is one, its live row (`row`) and upsert key (`upsert_key`) as they stand escaped in the text."""

    def __init__(self, states: pa.Array) -> None:
        parts = pc.extract_regex(states, _STORED)
        self.matched = pc.is_valid(parts)
        self.row = pc.struct_field(parts, "row")
        self.upsert_key = pc.struct_field(parts, "upsert_key")
