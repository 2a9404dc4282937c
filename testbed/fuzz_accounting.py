"""The accounting of a decoder fuzz run: every input record applied or accounted for, nothing else.

A record is *applied* when change rows carry its coordinates (change_index 0, 1, ..., no error);
*accounted for* when exactly one error row carries its coordinates, the policy that applies, a
reason that quotes no payload, and the record's key, value and headers byte for byte. A record
with no row at all is allowed only when it is a documented no-op (a tombstone after a delete,
Debezium's logical message 'm', a truncate under `truncate_handling: ignore`), decided here apart
from the decoder, with the standard JSON parser and fastavro. Anything else is a silent drop or a
wrong account, and so is an intact record (mutation "none") that is not applied; a decoder that raises is a crash (its culprits found by decoding the batch's
records one by one).
"""

from __future__ import annotations

import io
import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import fastavro
import pyarrow as pa

from connectors.schema_registry.wire_format import HEADER_SIZE, MAGIC_BYTE
from service.kafka_to_delta.changelog.changelog_batch import error_coordinates
from service.kafka_to_delta.changelog.from_changelog import TRUNCATE_FAILS
from service.kafka_to_delta.rows.arrow import CHANGELOG_SCHEMA
from testbed.fuzz_mutations import NONE
from testbed.fuzz_records import (
    FORMATS,
    FuzzFormat,
    FuzzInput,
    FuzzRecord,
    decoders,
    header_rows,
    raw_batch,
)

OUTCOMES = ("applied", "no-op", "FAIL", "LOG", "SKIP", "DEAD_LETTER")
KINDS = ("+I", "-U", "+U", "-D", "TRUNCATE")
PASSTHROUGH_CLASH = "passthrough column "
PAYLOAD_MARKERS = ("user-", "@example.com")  # in every workload row; no error reason may quote them
_UNREADABLE = object()


@dataclass
class Accounting:
    """Outcome counts of one policy run, and every record that was not accounted for."""

    policy: str
    outcomes: Counter = field(default_factory=Counter)
    by_mutation: Counter = field(default_factory=Counter)  # (mutation, outcome) -> records
    silent_drops: list[str] = field(default_factory=list)
    wrong_accounts: list[str] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    cpu_seconds: float = 0.0

    @property
    def records(self) -> int:
        """Input records seen (crashed ones included)."""
        return sum(self.outcomes.values()) + len(self.silent_drops) + len(self.crashes)

    def problems(self) -> list[str]:
        """Everything that breaks the guarantee, one line each."""
        return self.crashes + self.silent_drops + self.wrong_accounts


Crashes = dict[tuple[str, int, int], str]


@dataclass(frozen=True)
class Decoded:
    """The changelog rows of every record, the crashes by coordinates, and the time it took."""

    table: pa.Table
    crashes: Crashes
    seconds: float
    cpu_seconds: float


def decode(fuzz: FuzzInput, policy: str, pipeline: bool = False) -> Decoded:
    """Every record through its format's decoder under `policy`, one batch per topic partition."""
    batches: dict[tuple[str, int], list[FuzzRecord]] = defaultdict(list)
    for record in fuzz.records:
        batches[(record.topic, record.partition)].append(record)
    decoder_of = decoders(policy, fuzz.registry, pipeline)  # type: ignore[arg-type]
    out, crashes = [], {}
    started, cpu_started = time.perf_counter(), time.process_time()
    for (topic, _), records in batches.items():
        try:
            out.append(decoder_of[topic](raw_batch(records)))
        except Exception:  # noqa: BLE001 - a crash: find its records
            for record in records:
                try:
                    out.append(decoder_of[topic](raw_batch([record])))
                except Exception as exc:  # noqa: BLE001
                    crashes[record.coordinates] = f"{_where(record)}: {type(exc).__name__}: {str(exc)[:200]}"
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    return Decoded(pa.Table.from_batches(out, schema=CHANGELOG_SCHEMA), crashes, seconds, cpu_seconds)


def run(fuzz: FuzzInput, policy: str) -> tuple[Accounting, pa.Table]:
    """Decode every record under `policy` and account for each; also returns the decoded rows."""
    decoded = decode(fuzz, policy)
    return account(fuzz, policy, decoded), decoded.table


def account(fuzz: FuzzInput, policy: str, decoded: Decoded) -> Accounting:
    """The outcome of each input record (see the module docstring)."""
    table, crashes = decoded.table, decoded.crashes
    result = Accounting(policy, crashes=list(crashes.values()), seconds=decoded.seconds,
                        cpu_seconds=decoded.cpu_seconds)
    rows_of: dict[tuple, list[dict]] = defaultdict(list)
    for row in table.to_pylist():
        rows_of[(row["topic"], row["partition"], row["offset"])].append(row)
    phantom = set(rows_of) - {r.coordinates for r in fuzz.records}
    result.wrong_accounts += [f"rows for a record that was never read: {c}" for c in sorted(phantom)]
    fmt_of = {fmt.topic: fmt for fmt in FORMATS.values()}
    for record in fuzz.records:
        if record.coordinates in crashes:
            continue
        rows = rows_of.get(record.coordinates, [])
        if not rows:
            if _no_op(record, fmt_of[record.topic], fuzz):
                result.outcomes["no-op"] += 1
                result.by_mutation[(record.mutation, "no-op")] += 1
            else:
                result.silent_drops.append(f"{_where(record)}: no row and no error")
            continue
        outcome, wrong = _verdict(record, rows, policy)
        result.outcomes[outcome] += 1
        result.by_mutation[(record.mutation, outcome)] += 1
        result.wrong_accounts += [f"{_where(record)}: {problem}" for problem in wrong]
        if record.mutation == NONE and outcome not in ("applied", "no-op"):
            result.wrong_accounts.append(f"{_where(record)}: an intact record was rejected: {rows[0]['error']}")
    return result


def _where(record: FuzzRecord) -> str:
    return f"topic={record.topic} partition={record.partition} offset={record.offset} [{record.mutation}]"


def _verdict(record: FuzzRecord, rows: list[dict], policy: str) -> tuple[str, list[str]]:
    errors = [row for row in rows if row["error"] is not None]
    if not errors:
        return "applied", _change_problems(rows)
    row, wrong = rows[0], []
    if len(rows) != 1:
        wrong.append(f"{len(errors)} error row(s) among {len(rows)} rows")
    reason = row["error"]
    fixed_fail = reason == TRUNCATE_FAILS or reason.startswith(PASSTHROUGH_CLASH)
    expected = "FAIL" if fixed_fail else policy
    if row["handling"] != expected:
        wrong.append(f"handling {row['handling']!r}, expected {expected!r}")
    if row["kind"] is not None or row["stage"] not in ("decode", "from_changelog"):
        wrong.append(f"error row with kind {row['kind']!r}, stage {row['stage']!r}")
    if (row["raw_key"], row["raw_value"], row["headers"]) != (record.key, record.value, header_rows(record.headers)):
        wrong.append("error row does not hold the record's key, value and headers byte for byte")
    where = f"topic={record.topic} partition={record.partition} offset={record.offset}"
    if not str(error_coordinates(row)).startswith(where):
        wrong.append(f"error coordinates {error_coordinates(row)} are not the record's")
    if any(marker in reason for marker in PAYLOAD_MARKERS):
        wrong.append("the error reason quotes the payload")
    return row["handling"] if row["handling"] in OUTCOMES else "FAIL", wrong


def _change_problems(rows: list[dict]) -> list[str]:
    wrong = []
    if [row["change_index"] for row in rows] != list(range(len(rows))):
        wrong.append("change_index is not 0, 1, ...")
    for row in rows:
        if row["kind"] not in KINDS or (row["key"] is None and row["kind"] != "TRUNCATE"):
            wrong.append(f"change row with kind {row['kind']!r} and key {row['key']!r}")
        if (row["raw_key"], row["raw_value"], row["headers"], row["handling"]) != (None, None, None, None):
            wrong.append("a change row carries raw bytes or a policy")
    return wrong


def _no_op(record: FuzzRecord, fmt: FuzzFormat, fuzz: FuzzInput) -> bool:
    """A record FROM_CHANGELOG documents as producing nothing (every format here has an op field)."""
    if record.value is None:
        return True  # the tombstone after a delete
    document = _avro_document(record.value, fuzz) if fmt.avro else _json_document(record.value)
    if document is _UNREADABLE:
        return False
    if isinstance(document, dict) and len(document) == 2 and {"schema", "payload"} == set(document):
        document = document["payload"]
    if document is None:
        return True  # a Connect wrapper around a null payload: a tombstone
    if not isinstance(document, dict):
        return False
    op = document.get("op")
    return op == "m" or (op == "t" and fmt.settings("FAIL").truncate_handling == "ignore")


def _json_document(value: bytes) -> Any:
    try:
        return json.loads(value.decode("utf-8"))
    except (ValueError, RecursionError):
        return _UNREADABLE


def _avro_document(value: bytes, fuzz: FuzzInput) -> Any:
    if len(value) < HEADER_SIZE or value[0] != MAGIC_BYTE:
        return _UNREADABLE
    try:
        registered = fuzz.registry.schema_by_id(int.from_bytes(value[1:HEADER_SIZE], "big"))
        return fastavro.schemaless_reader(io.BytesIO(value[HEADER_SIZE:]), registered.parsed, None)
    except Exception:  # noqa: BLE001 - an unknown id, or whatever fastavro raises: unreadable
        return _UNREADABLE
