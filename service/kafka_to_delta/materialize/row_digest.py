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
