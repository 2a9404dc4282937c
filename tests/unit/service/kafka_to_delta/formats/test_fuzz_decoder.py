"""Fuzz of the executor-side decoder and the driver's bad-record policies (no Spark, no broker).

10,000 records per seed (`testbed.fuzz_records`: Debezium JSON with and without the Connect schema
block, flat op-coded JSON, Confluent Avro through a registry double; truncated, invalid UTF-8,
wrong types, missing fields, huge values, deep nesting, wrong magic bytes, unknown schema ids,
null keys and values, ...) go through `ChangelogBatchDecoder` as Kafka record batches under each
policy. The decoder never raises, and every record is applied or accounted for
(`testbed.fuzz_accounting`); then `handle_bad_records` applies each policy: FAIL raises naming the
earliest record's coordinates and stores nothing, LOG warns with coordinates, SKIP and LOG count,
DEAD_LETTER hands over every bad record byte for byte.

Seeds: `FIXED_SEEDS` plus one random seed (`FUZZ_SEED=<n>` replays one); failures name the seed.
"""

from __future__ import annotations

import logging
import os
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from prometheus_client import REGISTRY

from service.config.dead_letters import DeadLetterSettings
from service.kafka_to_delta.changelog.changelog_batch import error_coordinates
from service.kafka_to_delta.sink.bad_records import failed_rows, handle_bad_records
from service.kafka_to_delta.sink.dead_letters import DeadLetterSink
from testbed.fuzz_accounting import PAYLOAD_MARKERS, Accounting, run
from testbed.fuzz_records import POLICIES, FuzzInput, generate, header_rows
from tests.support.run_seed import run_seed
from vocabulary.errors import DecodeError

RECORDS = 10_000
FIXED_SEEDS = (0, 994)
RANDOM_SEED = int(os.environ.get("FUZZ_SEED", run_seed(1_000_000)))
SEEDS = (*FIXED_SEEDS, RANDOM_SEED)
ERROR_OUTCOMES = ("FAIL", "LOG", "SKIP", "DEAD_LETTER")
BAD_RECORDS_METRIC = "cdc_bad_records_total"

Runs = dict[str, tuple[Accounting, pa.Table]]


@pytest.fixture(scope="module", params=SEEDS, ids=lambda seed: f"seed={seed}")
def fuzz_runs(request: pytest.FixtureRequest) -> tuple[FuzzInput, Runs]:
    """One seed's records, decoded under each policy."""
    fuzz = generate(request.param, RECORDS)
    return fuzz, {policy: run(fuzz, policy) for policy in POLICIES}


def _seed(fuzz: FuzzInput) -> str:
    return f"seed {fuzz.seed} (replay: FUZZ_SEED={fuzz.seed} pytest {__file__})"


def test_the_decoder_never_raises_and_accounts_for_every_record(fuzz_runs):
    fuzz, runs = fuzz_runs
    splits, fixed_fails = {}, set()
    for policy, (accounting, _) in runs.items():
        problems = accounting.problems()
        assert not problems, f"{_seed(fuzz)}, {policy}: {len(problems)} record(s) not accounted for:\n" + "\n".join(
            problems[:30])
        assert accounting.records == len(fuzz.records)
        outcomes = accounting.outcomes
        errors = sum(outcomes[o] for o in ERROR_OUTCOMES)
        assert outcomes["applied"] > len(fuzz.records) // 4 and errors > len(fuzz.records) // 4, (policy, outcomes)
        assert outcomes["no-op"] > 0 and outcomes[policy] > 0, (policy, outcomes)
        splits[policy] = (outcomes["applied"], outcomes["no-op"], errors)
        if policy != "FAIL":
            fixed_fails.add(outcomes["FAIL"])  # truncates under truncate_handling 'fail'
    assert len(set(splits.values())) == 1, f"{_seed(fuzz)}: the policy changed which records fail: {splits}"
    assert len(fixed_fails) == 1, f"{_seed(fuzz)}: {fixed_fails}"


def _coordinates(row: dict) -> tuple[str, int, int]:
    return row["topic"], row["partition"], row["offset"]


def _bad_records_count(pipeline: str, handling: str, stage: str) -> float:
    labels = {"pipeline": pipeline, "handling": handling, "stage": stage}
    return REGISTRY.get_sample_value(BAD_RECORDS_METRIC, labels) or 0.0


class _CapturingStore:
    """A dead-letter store double: keeps what it is handed."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def __call__(self, rows: pa.Table, batch_id: int) -> int:
        self.rows += rows.to_pylist()
        return rows.num_rows


def _assert_fail_names_the_earliest_record(pipeline: str, failed: pa.Table, store: _CapturingStore) -> None:
    fatal = failed.filter(pc.equal(failed.column("handling"), "FAIL")).to_pylist()
    with pytest.raises(DecodeError) as raised:
        handle_bad_records(pipeline, failed, 3, store)
    message = str(raised.value)
    first = min(fatal, key=_coordinates)
    assert str(error_coordinates(first)) in message and first["error"] in message, message
    assert len(fatal) == 1 or f"{len(fatal) - 1} more bad record(s)" in message, message
    assert not any(marker in message for marker in PAYLOAD_MARKERS), message
    assert store.rows == [], "FAIL stored dead letters of a batch that is not committed"


def _assert_counted_logged_and_stored(fuzz: FuzzInput, pipeline: str, rest: pa.Table, store: _CapturingStore,
                                      caplog: pytest.LogCaptureFixture) -> None:
    rows = rest.to_pylist()
    counts = Counter((row["handling"], row["stage"]) for row in rows)
    before = {key: _bad_records_count(pipeline, *key) for key in counts}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="service.kafka_to_delta.sink.bad_records"):
        handle_bad_records(pipeline, rest, 3, store)
    assert {key: _bad_records_count(pipeline, *key) - before[key] for key in counts} == dict(counts)
    logged = sorted(str(error_coordinates(row)) for row in rows if row["handling"] == "LOG")
    warned = sorted(str(record.args[1]) for record in caplog.records)  # (pipeline, where, stage, reason)
    assert warned == logged, "LOG records and warnings with their coordinates differ"
    assert all(str(record.args[1]) in record.getMessage() for record in caplog.records)
    assert not any(marker in caplog.text for marker in PAYLOAD_MARKERS), "a payload reached the log"
    by_coordinates = {record.coordinates: record for record in fuzz.records}
    letters = [row for row in rows if row["handling"] == "DEAD_LETTER"]
    assert sorted(map(_coordinates, store.rows)) == sorted(map(_coordinates, letters))
    for row in store.rows:
        record = by_coordinates[_coordinates(row)]
        assert (row["raw_key"], row["raw_value"], row["headers"]) == (record.key, record.value,
                                                                      header_rows(record.headers))


def test_the_driver_applies_each_policy(fuzz_runs, caplog):
    fuzz, runs = fuzz_runs
    for policy, (_, table) in runs.items():
        pipeline, store = f"fuzz-{fuzz.seed}-{policy}", _CapturingStore()
        failed = failed_rows(table)
        is_fatal = pc.equal(failed.column("handling"), "FAIL")
        if pc.any(is_fatal).as_py():  # FAIL records (under every policy: truncates with truncate_handling 'fail')
            _assert_fail_names_the_earliest_record(pipeline, failed, store)
        rest = failed.filter(pc.invert(is_fatal))
        assert (rest.num_rows == 0) == (policy == "FAIL"), (_seed(fuzz), policy, rest.num_rows)
        _assert_counted_logged_and_stored(fuzz, pipeline, rest, store, caplog)


def test_dead_letters_are_stored_byte_for_byte(fuzz_runs, tmp_path):
    fuzz, runs = fuzz_runs
    failed = failed_rows(runs["DEAD_LETTER"][1])
    letters = failed.filter(pc.equal(failed.column("handling"), "DEAD_LETTER"))
    sink = DeadLetterSink(DeadLetterSettings(table="dlq"), "fuzz", table_uri=str(tmp_path / "dlq"))
    assert sink.store(letters, 1) == letters.num_rows
    stored = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    by_coordinates = {record.coordinates: record for record in fuzz.records}
    reasons = {_coordinates(row): (row["stage"], row["error"]) for row in letters.to_pylist()}
    assert sorted(map(_coordinates, stored)) == sorted(reasons), _seed(fuzz)
    for row in stored:
        record = by_coordinates[_coordinates(row)]
        assert (row["key"], row["value"], row["headers"]) == (record.key, record.value, header_rows(record.headers))
        assert (row["stage"], row["error"]) == reasons[_coordinates(row)]
