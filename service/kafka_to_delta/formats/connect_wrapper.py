"""Skip re-parsing a Kafka Connect JSON schema block that repeats record after record.

The JSON converter writes `{"schema":S,"payload":P}` with the same S (often 3 KB) on every
record of a table; other writers put JSON whitespace between the tokens (`{"schema": S, "payload": P}`,
as Python's `json.dumps` does). Once a full parse has confirmed that the bytes between `{"schema":`
and the first `,"payload":` (each with any whitespace between its tokens) parse to exactly the
document's schema, any later value that starts with those same bytes, whitespace included, carries
that same schema, and only P needs parsing. Inside a JSON string a quote is always escaped, so the
prefix can only end where the schema object ends; the payload slice must still parse as one
complete JSON value, or the caller parses the whole document as usual. The shortcut never changes
a result, it only saves work.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Generic, TypeVar

WRAPPER_HEAD = re.compile(rb'\{[ \t\n\r]*"schema"[ \t\n\r]*:')
PAYLOAD_SEPARATOR = re.compile(rb'[ \t\n\r]*,[ \t\n\r]*"payload"[ \t\n\r]*:[ \t\n\r]*')
DOCUMENT_END = b"}"
_WHITESPACE = b" \t\n\r"
_MAX_KNOWN = 16

Attached = TypeVar("Attached")


class KnownSchemas(Generic[Attached]):
    """Recently confirmed schema prefixes, each with a value derived from its schema."""

    def __init__(self, loads: Callable[[bytes], Any]) -> None:
        self._loads = loads
        self._known: list[tuple[bytes, Attached]] = []

    def split(self, value: bytes) -> tuple[Any, Attached] | None:
        """(payload, attached) when `value` wraps a known schema; None: parse it in full."""
        if not value.endswith(DOCUMENT_END):
            value = value.rstrip(_WHITESPACE)
            if not value.endswith(DOCUMENT_END):
                return None
        for prefix, attached in self._known:
            if value.startswith(prefix):
                try:
                    return self._loads(value[len(prefix):-len(DOCUMENT_END)]), attached
                except ValueError:
                    return None
        return None

    def learn(self, value: bytes, schema: Any, attached: Attached) -> None:
        """Remember the schema bytes of `value`, whose full parse gave `schema` (a wrapper)."""
        head = WRAPPER_HEAD.match(value)
        if head is None:
            return
        separator = PAYLOAD_SEPARATOR.search(value, head.end())
        if separator is None:
            return
        try:
            if self._loads(value[head.end():separator.start()]) != schema:
                return
        except ValueError:
            return
        prefix = value[:separator.end()]
        self._known = [(prefix, attached)] + [k for k in self._known if k[0] != prefix][: _MAX_KNOWN - 1]
