"""Row digests in the materializer's state: what a key keeps when its rows are only ever compared.

The rules keep each live row's text (`key_state.LiveRow.row`) for two uses: to tell whether the winner
after a barrier differs from the row the table holds (equality), and to write an earlier live row back
when the winner is retracted (a rollback under `deduplicate`, several upsert keys per primary key).
When a table has one source whose upsert key is its primary key, a key holds at most one live row, so
no rollback can happen: the net row is always one of the barrier's own changes. Such a pipeline keeps
a digest of each row instead of its text (`StageConfig.row_digests`), so the state no longer grows
with the rows' width: a captured table with TOASTed text kept about 1.5 KB a key, rewritten every
micro-batch that touched its bucket (docs/design/materializer-state.md, "Row digests").

A digest is `#` and the base64 (URL alphabet, no padding) of the row text's 16-byte BLAKE2b: a row
text is JSON, which never starts with `#`, so a state written before (full rows) is told apart and
its rows are digested when their key is next touched (`digested_state`).
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from service.kafka_to_delta.materialize.key_state import PkState, decode_state, encode_state

PREFIX = "#"
_ROW_FIELD = '"r":"'


def row_digest(row: str) -> str:
    """The digest that stands for `row` in the state."""
    digest = hashlib.blake2b(row.encode(), digest_size=16).digest()
    return PREFIX + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def is_digest(row: str) -> bool:
    """Whether a stored row is a digest (`row_digest`), not a row's text."""
    return row.startswith(PREFIX)


def digested(records: list[dict]) -> list[dict]:
    """`records` with each row text replaced by its digest (copies; rows that are None stay None)."""
    return [record if record["row"] is None else {**record, "row": row_digest(record["row"])} for record in records]


def digested_state(text: str | None) -> str | None:
    """A stored state with every live row's text replaced by its digest (unchanged when it holds none)."""
    if text is None or text.count(_ROW_FIELD) == text.count(_ROW_FIELD + PREFIX):
        return text
    state = decode_state(text)
    rows = [live if is_digest(live.row) else replace(live, row=row_digest(live.row)) for live in state.rows]
    return encode_state(PkState(rows, state.tombstones))


def row_digests(rows: pa.Array, chosen: np.ndarray) -> pa.Array:
    """`row_digest` of each of the `chosen` rows (null elsewhere), hashed from the column's buffer: no row
    becomes a Python string. The digests are encoded at once: each padded to 18 bytes (a whole number of
    base64 quanta), whose first 22 characters are its unpadded encoding."""
    at = np.flatnonzero(chosen & _flags(pc.is_valid(rows)))
    if not at.size:
        return pa.nulls(len(rows), pa.string())
    _, offsets_buffer, data_buffer = rows.buffers()
    width = np.int64 if pa.types.is_large_string(rows.type) else np.int32
    offsets = np.frombuffer(offsets_buffer, width)[rows.offset:rows.offset + len(rows) + 1].tolist()
    data = memoryview(data_buffer) if data_buffer is not None else memoryview(b"")
    blake2b = hashlib.blake2b
    padded = b"".join(blake2b(data[offsets[i]:offsets[i + 1]], digest_size=16).digest() + b"\0\0"
                      for i in at.tolist())
    encoded = np.frombuffer(base64.urlsafe_b64encode(padded), np.uint8).reshape(-1, 24)[:, :22]
    texts = np.empty((at.size, 23), np.uint8)
    texts[:, 0] = ord(PREFIX)
    texts[:, 1:] = encoded
    digests = pa.StringArray.from_buffers(at.size, pa.py_buffer(np.arange(0, 23 * at.size + 1, 23, dtype=np.int32)),
                                          pa.py_buffer(texts.tobytes()))
    positions = np.full(len(rows), -1)
    positions[at] = np.arange(at.size)
    return digests.take(pa.array(positions, mask=positions < 0))


def _flags(mask: pa.Array) -> np.ndarray:
    return pc.fill_null(mask, False).to_numpy(zero_copy_only=False)
