"""One vocabulary for changelog rows: change kinds, Debezium op codes, envelope field names."""

from __future__ import annotations

from enum import Enum


class ChangeKind(str, Enum):
    """Kind of a changelog row (spec: RowKind)."""

    INSERT = "+I"
    UPDATE_BEFORE = "-U"
    UPDATE_AFTER = "+U"
    DELETE = "-D"

    @property
    def is_retraction(self) -> bool:
        """True for kinds that take a row away (-U, -D)."""
        return self in (ChangeKind.UPDATE_BEFORE, ChangeKind.DELETE)


class DebeziumOp(str, Enum):
    """Debezium envelope `op` codes."""

    CREATE = "c"
    READ = "r"
    UPDATE = "u"
    DELETE = "d"
    TRUNCATE = "t"
    MESSAGE = "m"


class Envelope:
    """Field names of the Debezium envelope and the Kafka Connect JSON wrapper."""

    OP = "op"
    BEFORE = "before"
    AFTER = "after"
    SOURCE = "source"
    TS_MS = "ts_ms"
    SCHEMA = "schema"
    PAYLOAD = "payload"
    FIELDS = "fields"


# Standard Debezium mapping for the walking skeleton: the net effect of one event on its key.
DEBEZIUM_NET_KIND: dict[DebeziumOp, ChangeKind] = {
    DebeziumOp.CREATE: ChangeKind.INSERT,
    DebeziumOp.READ: ChangeKind.INSERT,
    DebeziumOp.UPDATE: ChangeKind.UPDATE_AFTER,
    DebeziumOp.DELETE: ChangeKind.DELETE,
}
