"""The SQL workload of the real-capture test: tables, snapshot rows, a mixed streaming phase, a marker.

Deterministic for a seed. Every streamed statement touches one row, except one bulk update.
The cases it always contains:
- a primary-key change (`UPDATE ... SET id = ...`) on a default-identity and on a FULL-identity table;
- re-inserts: a deleted `customers` id inserted again;
- `orders` with REPLICA IDENTITY FULL (updates and deletes carry the whole old row);
- `tags` without a primary key (REPLICA IDENTITY FULL; its rows are kept distinct, so it is a set);
- `documents` whose large, incompressible `body` (> 8 KB, stored out of line) stays unchanged
  while `revision` changes: Debezium sends its unavailable-value placeholder for `body`;
- a `TRUNCATE tags` a third of the way through the streaming phase, right followed by new rows;
- NULLs, negative and extreme numbers, dates before 1970, non-UTC offsets, quotes and non-ASCII text.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Callable

SCHEMA = "public"
MARKER_TABLE = "capture_marker"
MARKER_RECORDS = 2
"""Records the marker table yields: its snapshot row and the final row inserted last."""


@dataclass(frozen=True)
class SourceTable:
    """A captured table; `primary_key` is empty for a table without one."""

    name: str
    columns: tuple[str, ...]
    primary_key: tuple[str, ...]
    ddl: str

    @property
    def sink_key(self) -> tuple[str, ...]:
        """The Delta primary key: the source key, or every column when the table has none (a set)."""
        return self.primary_key or self.columns


TABLES = (
    SourceTable("customers", ("id", "name", "email", "active", "born", "signed_up", "last_seen", "balance",
                              "visits"), ("id",),
                "CREATE TABLE customers (id integer PRIMARY KEY, name text NOT NULL, email varchar(120), "
                "active boolean NOT NULL, born date, signed_up timestamp NOT NULL, last_seen timestamptz, "
                "balance numeric(10,2) NOT NULL, visits bigint NOT NULL)"),
    SourceTable("orders", ("id", "customer_id", "amount", "status", "placed_on", "placed_at", "shipped", "note"),
                ("id",),
                "CREATE TABLE orders (id bigint PRIMARY KEY, customer_id integer NOT NULL, "
                "amount numeric(10,2) NOT NULL, status varchar(20) NOT NULL, placed_on date NOT NULL, "
                "placed_at timestamptz NOT NULL, shipped boolean NOT NULL, note text); "
                "ALTER TABLE orders REPLICA IDENTITY FULL"),
    SourceTable("tags", ("label", "weight", "tagged_on", "flagged"), (),
                "CREATE TABLE tags (label varchar(40) NOT NULL, weight integer NOT NULL, "
                "tagged_on date NOT NULL, flagged boolean NOT NULL); ALTER TABLE tags REPLICA IDENTITY FULL"),
    SourceTable("documents", ("id", "title", "body", "revision", "edited_at"), ("id",),
                "CREATE TABLE documents (id integer PRIMARY KEY, title varchar(200) NOT NULL, body text NOT NULL, "
                "revision integer NOT NULL, edited_at timestamp NOT NULL); "
                "ALTER TABLE documents ALTER COLUMN body SET STORAGE EXTERNAL"),
    SourceTable(MARKER_TABLE, ("id", "note"), ("id",),
                f"CREATE TABLE {MARKER_TABLE} (id integer PRIMARY KEY, note text NOT NULL)"),
)
TABLES_BY_NAME = {t.name: t for t in TABLES}

SNAPSHOT_ROWS = {"customers": 600, "orders": 400, "tags": 150, "documents": 40}
STREAMED_STATEMENTS = {
    ("customers", "insert"): 700, ("customers", "update"): 550, ("customers", "delete"): 150,
    ("customers", "change_key"): 5, ("customers", "reinsert"): 20,
    ("orders", "insert"): 300, ("orders", "update"): 300, ("orders", "delete"): 100, ("orders", "change_key"): 2,
    ("tags", "insert"): 100, ("tags", "update"): 80, ("tags", "delete"): 40,
    ("documents", "keep_body"): 25, ("documents", "new_body"): 5, ("documents", "insert"): 8,
    ("documents", "delete"): 3,
}
BULK_UPDATE = "UPDATE orders SET shipped = TRUE, note = 'bulk' WHERE status = 'paid' AND NOT shipped"
TRUNCATED_TABLE = "tags"
REFILL_ROWS = 60
"""Rows inserted right after the truncate, so that the table's later updates and deletes find rows."""
LARGE_BODY_CHARS = (9_000, 14_000)
SMALL_BODY_CHARS = (40, 400)
BODY_ALPHABET = string.ascii_letters + string.digits + " "
NAMES = ("Ana", "Zoë", "O'Brien", "Łukasz", "李雷", "Nguyễn", "Ægir", "Renée \"R\"", "Ömer", "Sam 🚀", "D'Arcy")
STATUSES = ("new", "paid", "packed", "returned", "cancelled")
LABELS = ("red", "green", "blue", "urgent", "vip", "größe", "🏷", "o'neil")
OFFSETS_MINUTES = (0, 60, -300, 330, 545, -600)
EPOCH = datetime(1970, 1, 1)
MAX_BALANCE_CENTS = 10**10 - 1  # numeric(10,2)
CHUNK_ROWS = 200


class SqlExpression(str):
    """SQL text used as it is (e.g. `revision + 1`), not quoted as a literal."""


def sql_literal(value: Any) -> str:
    """An SQL literal for a Python value (strings quoted, NULL for None)."""
    if isinstance(value, SqlExpression):
        return str(value)
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (int, Decimal)):
        return str(value)
    if isinstance(value, (date, datetime)):
        return f"'{value.isoformat(sep=' ') if isinstance(value, datetime) else value.isoformat()}'"
    return "'" + str(value).replace("'", "''") + "'"


class _Pool:
    """A set of row identities with O(1) random pick and removal."""

    def __init__(self) -> None:
        self.items: list = []
        self.index: dict = {}

    def add(self, item) -> None:
        self.index[item] = len(self.items)
        self.items.append(item)

    def remove(self, item) -> None:
        position = self.index.pop(item)
        last = self.items.pop()
        if position < len(self.items):
            self.items[position] = last
            self.index[last] = position

    def __contains__(self, item) -> bool:
        return item in self.index


class Workload:
    """Generates the SQL of each phase; keeps a model of live row identities to aim updates and deletes."""

    def __init__(self, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.ids = {name: _Pool() for name in ("customers", "orders", "documents")}
        self.next_id = {"customers": 1, "orders": 10**10, "documents": 1}  # bigint ids beyond 32 bits
        self.tags = _Pool()  # whole rows: the table is a set
        self.large_documents = _Pool()
        self.deleted: list[int] = []  # deleted customers ids, for re-inserts

    # --- values -------------------------------------------------------------------------
    def _timestamp(self) -> datetime:
        return EPOCH + timedelta(microseconds=self.rng.randrange(946_684_800 * 10**6, 1_893_456_000 * 10**6))

    def _zoned(self) -> datetime:
        zone = timezone(timedelta(minutes=self.rng.choice(OFFSETS_MINUTES)))
        return self._timestamp().replace(tzinfo=timezone.utc).astimezone(zone)

    def _date(self, first_year: int = 1940) -> date:
        return date(first_year, 1, 1) + timedelta(days=self.rng.randrange(0, (2030 - first_year) * 365))

    def _cents(self, bound: int = MAX_BALANCE_CENTS) -> Decimal:
        return Decimal(self.rng.choice((0, bound, -bound, self.rng.randint(-bound, bound)))).scaleb(-2)

    def _maybe(self, make: Callable[[], Any], null_share: float = 0.15) -> Any:
        return None if self.rng.random() < null_share else make()

    def _text(self, bounds: tuple[int, int]) -> str:
        return "".join(self.rng.choices(BODY_ALPHABET, k=self.rng.randint(*bounds)))

    # --- rows ---------------------------------------------------------------------------
    def _new_id(self, table: str) -> int:
        self.next_id[table] += 1
        self.ids[table].add(self.next_id[table] - 1)
        return self.next_id[table] - 1

    def _customer(self, rid: int) -> dict:
        return {"id": rid, "name": f"{self.rng.choice(NAMES)} {rid}",
                "email": self._maybe(lambda: f"user{rid}@example.org"), "active": self.rng.random() < 0.7,
                "born": self._maybe(self._date), "signed_up": self._timestamp(), "last_seen": self._maybe(self._zoned),
                "balance": self._cents(), "visits": self.rng.choice((0, 2**63 - 1, -(2**63), self.rng.getrandbits(40)))}

    def _order(self, rid: int) -> dict:
        return {"id": rid, "customer_id": self.rng.randint(1, 5_000), "amount": self._cents(10**7),
                "status": self.rng.choice(STATUSES), "placed_on": self._date(2000), "placed_at": self._zoned(),
                "shipped": self.rng.random() < 0.3, "note": self._maybe(lambda: self._text(SMALL_BODY_CHARS), 0.5)}

    def _tag(self) -> dict:
        while True:
            row = (self.rng.choice(LABELS), self.rng.randint(-1000, 1000), self._date(2015), self.rng.random() < 0.5)
            if row not in self.tags:
                self.tags.add(row)
                return dict(zip(TABLES_BY_NAME["tags"].columns, row))

    def _document(self, large: bool) -> dict:
        rid = self._new_id("documents")
        if large:
            self.large_documents.add(rid)
        return {"id": rid, "title": f"{self.rng.choice(NAMES)}'s notes #{rid}", "revision": 1,
                "body": self._text(LARGE_BODY_CHARS if large else SMALL_BODY_CHARS), "edited_at": self._timestamp()}

    def _new_row(self, table: str, large: bool = False) -> dict:
        if table == "customers":
            return self._customer(self._new_id(table))
        if table == "orders":
            return self._order(self._new_id(table))
        return self._tag() if table == "tags" else self._document(large)

    # --- statements ---------------------------------------------------------------------
    @staticmethod
    def _insert(table: str, rows: list[dict]) -> str:
        columns = TABLES_BY_NAME[table].columns
        values = ",\n".join("(" + ", ".join(sql_literal(row[c]) for c in columns) + ")" for row in rows)
        return f"INSERT INTO {table} ({', '.join(columns)}) VALUES\n{values};"

    @staticmethod
    def _update(table: str, assignments: dict[str, Any], where: dict[str, Any]) -> str:
        sets = ", ".join(f"{c} = {sql_literal(v)}" for c, v in assignments.items())
        condition = " AND ".join(f"{c} = {sql_literal(v)}" for c, v in where.items())
        return f"UPDATE {table} SET {sets} WHERE {condition};"

    def _pick(self, pool: _Pool):
        return self.rng.choice(pool.items)

    def _change_some(self, table: str, rid: int) -> str:
        fresh = self._customer(rid) if table == "customers" else self._order(rid)
        columns = self.rng.sample([c for c in fresh if c != "id"], self.rng.randint(1, 3))
        return self._update(table, {c: fresh[c] for c in columns}, {"id": rid})

    def _change_key(self, table: str) -> str:
        old = self._pick(self.ids[table])
        self.ids[table].remove(old)
        other = {"active": SqlExpression("NOT active")} if table == "customers" else {"status": "rekeyed"}
        return self._update(table, {"id": self._new_id(table), **other}, {"id": old})

    def _delete(self, table: str) -> str:
        rid = self._pick(self.ids[table])
        self.ids[table].remove(rid)
        if rid in self.large_documents:
            self.large_documents.remove(rid)
        if table == "customers":
            self.deleted.append(rid)
        return f"DELETE FROM {table} WHERE id = {rid};"

    def _reinsert(self) -> str:
        """A deleted customer inserted again under its id (a new one while none was deleted yet)."""
        if not self.deleted:
            return self._insert("customers", [self._new_row("customers")])
        rid = self.deleted.pop(self.rng.randrange(len(self.deleted)))
        self.ids["customers"].add(rid)
        return self._insert("customers", [self._customer(rid)])

    def _tag_statement(self, op: str) -> str:
        old = self._pick(self.tags)
        where = dict(zip(TABLES_BY_NAME["tags"].columns, old))
        self.tags.remove(old)
        if op == "delete":
            return "DELETE FROM tags WHERE " + " AND ".join(f"{c} = {sql_literal(v)}" for c, v in where.items()) + ";"
        new = old
        while new in self.tags or new == old:
            new = (old[0], self.rng.randint(-1000, 1000), old[2], not old[3] if self.rng.random() < 0.5 else old[3])
        self.tags.add(new)
        return self._update("tags", {"weight": new[1], "flagged": new[3]}, where)

    def _document_statement(self, op: str) -> str:
        changes = {"revision": SqlExpression("revision + 1"), "edited_at": self._timestamp()}
        if op == "keep_body":  # body untouched: its TOAST value is not in the WAL record
            return self._update("documents", changes, {"id": self._pick(self.large_documents)})
        rid = self._pick(self.ids["documents"])
        if rid not in self.large_documents:
            self.large_documents.add(rid)
        return self._update("documents", {**changes, "body": self._text(LARGE_BODY_CHARS)}, {"id": rid})

    def _truncate_tags(self) -> str:
        self.tags = _Pool()
        refill = self._insert(TRUNCATED_TABLE, [self._tag() for _ in range(REFILL_ROWS)])
        return f"TRUNCATE {TRUNCATED_TABLE};\n{refill}"

    def _statement(self, table: str, op: str) -> str:
        if op == "insert":
            return self._insert(table, [self._new_row(table, large=self.rng.random() < 0.5)])
        if table == "tags":
            return self._tag_statement(op)
        if op == "delete":
            return self._delete(table)
        if op == "change_key":
            return self._change_key(table)
        if op == "reinsert":
            return self._reinsert()
        if table == "documents":
            return self._document_statement(op)
        return self._change_some(table, self._pick(self.ids[table]))

    # --- phases -------------------------------------------------------------------------
    def schema_sql(self) -> str:
        """CREATE TABLE statements for every captured table."""
        return "\n".join(f"{t.ddl};" for t in TABLES)

    def snapshot_sql(self) -> str:
        """The rows present before capture starts (one marker row among them)."""
        statements = []
        for table, count in SNAPSHOT_ROWS.items():
            rows = [self._new_row(table, large=i % 2 == 0) for i in range(count)]
            statements += [self._insert(table, rows[i:i + CHUNK_ROWS]) for i in range(0, count, CHUNK_ROWS)]
        statements.append(self._insert(MARKER_TABLE, [{"id": 0, "note": "snapshot"}]))
        return "\n".join(statements)

    def streaming_sql(self) -> str:
        """The streamed phase: shuffled single-row statements, some alone, most in transactions."""
        ops = [key for key, count in STREAMED_STATEMENTS.items() for _ in range(count)]
        self.rng.shuffle(ops)
        statements = []
        for index, (table, op) in enumerate(ops):
            if index == len(ops) // 3:
                statements.append(self._truncate_tags())
            statements.append(self._statement(table, op))
        statements.insert(len(statements) // 2, BULK_UPDATE + ";")
        script, position = [], 0
        while position < len(statements):
            size = 1 if self.rng.random() < 0.3 else self.rng.randint(2, 40)
            chunk = statements[position:position + size]
            script += chunk if size == 1 else ["BEGIN;", *chunk, "COMMIT;"]
            position += size
        return "\n".join(script)

    @staticmethod
    def marker_sql() -> str:
        """The last transaction of the workload: once captured, everything before it is too."""
        return Workload._insert(MARKER_TABLE, [{"id": 1, "note": "end of workload"}])
