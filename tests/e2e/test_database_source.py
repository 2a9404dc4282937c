"""A database source: every Debezium topic of a database -> one streaming query -> one Delta table
per topic, each equal to its replay; new topics picked up; one table's terminal error quarantines
that table alone, and a restart after the fix resumes it exactly."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time

import pytest

from service.operations.workload import DebeziumWorkload, Event, create_topics, produce
from tests.support.pipeline_harness import (
    CLI,
    kill_group,
    run_cli,
    start_cli,
    table_rows,
    table_version,
    wait_for_table,
    write_config,
)

pytestmark = pytest.mark.slow
SALT_ENV, SALT = "CDC_E2E_DATABASE_SALT", "pepper-e2e"
SOFT = ("__DELETED", "__DELETED_AT")
VALIDITY = ("__START_AT", "__END_AT", "__UPDATED_AT", "__DELETED")


def _hashed(value: str) -> str:
    return hashlib.sha256((SALT + value).encode()).hexdigest()


def _database(unique: str, **extra) -> dict:
    return {"name": f"db_{unique}", "topic_pattern": rf"dbs\.{unique}\.(?P<schema>[^.]+)\.(?P<table>[^.]+)",
            "table_name": "{schema}_{table}", **extra}


def _workloads(unique: str, names: list[str], seed: int = 0) -> dict[str, DebeziumWorkload]:
    return {name: DebeziumWorkload(f"dbs.{unique}.public.{name}", 2, "always" if i % 2 == 0 else "never",
                                   seed=seed + i) for i, name in enumerate(names)}


def _load(bootstrap: str, workloads: dict[str, DebeziumWorkload], events: int, keys: int) -> None:
    create_topics(bootstrap, [w.topic for w in workloads.values()], 2)
    for workload in workloads.values():
        produce(bootstrap, workload.generate(events, keys))


def _config(workdir, bootstrap: str, databases: list[dict], **extra):
    return write_config(workdir / "config.yaml", bootstrap, workdir, [], databases=databases, **extra)


def test_database_tables_equal_replay_new_topics_picked_up_reruns_idempotent(kafka_bootstrap, unique, workdir):
    workloads = _workloads(unique, ["orders", "customers", "items"])
    _load(kafka_bootstrap, workloads, 1_500, 300)
    create_topics(kafka_bootstrap, [f"other.{unique}.public.orders"], 1)  # not the database's
    config = _config(workdir, kafka_bootstrap, [_database(unique, exclude=["public_items"])])
    first = run_cli(config, "--until-idle")
    assert first.returncode == 0, first.stderr[-3000:]
    for name in ("orders", "customers"):
        assert table_rows(workdir / "tables" / f"public_{name}") == workloads[name].expected_rows(), name
    assert not (workdir / "tables" / "public_items").exists()
    assert f"db_{unique}: batch 0 -> 2 table(s)" in first.stdout + first.stderr
    assert f"table public_orders from topic(s) dbs.{unique}.public.orders, primary key (id)" in first.stderr
    versions = {n: table_version(workdir / "tables" / f"public_{n}") for n in ("orders", "customers")}

    # A table created later: picked up from its earliest offset; the others unchanged by a re-run.
    later = _workloads(unique, ["invoices"], seed=7)
    _load(kafka_bootstrap, later, 900, 200)
    second = run_cli(config, "--until-idle")
    assert second.returncode == 0, second.stderr[-3000:]
    assert table_rows(workdir / "tables" / "public_invoices") == later["invoices"].expected_rows()
    assert {n: table_version(workdir / "tables" / f"public_{n}") for n in ("orders", "customers")} == versions

    # validate lists the tables matched now; status has a line per table, lag 0.
    validate = subprocess.run([CLI, "validate", str(config)], capture_output=True, text=True, timeout=120)
    assert validate.returncode == 0 and "3 table(s) matched now" in validate.stdout, validate.stdout
    status = subprocess.run([CLI, "status", str(config), "--json"], capture_output=True, text=True, timeout=120)
    rows = {row["pipeline"]: row for row in json.loads(status.stdout)}
    assert set(rows) == {f"db_{unique}.public_{n}" for n in ("orders", "customers", "invoices")}, status.stdout
    assert all(row["lag"] == 0 and row["delta_batch"] is not None for row in rows.values()), status.stdout

    # A topic already written to one table routed to another is refused before anything runs.
    moved = _config(workdir, kafka_bootstrap, [_database(unique, exclude=["public_items"], table_name="x_{table}")])
    refused = run_cli(moved, "--until-idle")
    assert refused.returncode != 0 and "routes topics already written to other tables" in refused.stderr, \
        refused.stderr[-3000:]


def test_topic_created_while_running_is_picked_up(kafka_bootstrap, unique, workdir):
    workloads = _workloads(unique, ["first"])
    _load(kafka_bootstrap, workloads, 400, 100)
    config = _config(workdir, kafka_bootstrap, [_database(unique, topic_refresh_seconds=2)])
    log = workdir / "run.log"
    process = start_cli(config, log=log)
    try:
        first = workdir / "tables" / "public_first"
        wait_for_table(first, lambda: table_rows(first) == workloads["first"].expected_rows(), process, log)
        later = _workloads(unique, ["second"], seed=3)
        _load(kafka_bootstrap, later, 400, 100)
        started = time.monotonic()
        second = workdir / "tables" / "public_second"
        wait_for_table(second, lambda: table_rows(second) == later["second"].expected_rows(), process, log)
        assert time.monotonic() - started < 120
    finally:
        kill_group(process)


def test_a_quarantined_table_does_not_hold_the_others_and_resumes_exactly(kafka_bootstrap, unique, workdir):
    workloads = _workloads(unique, ["good", "bad"])
    _load(kafka_bootstrap, workloads, 600, 150)
    bad = workloads["bad"]
    produce(kafka_bootstrap, [Event(bad.topic, 0, json.dumps({"id": 1}).encode(), b"{not json")])  # FAIL: terminal
    produce(kafka_bootstrap, bad.generate(300, 150)[:300])
    database = _database(unique, on_table_error="quarantine")
    config = _config(workdir, kafka_bootstrap, [database])
    first = run_cli(config, "--until-idle")
    assert first.returncode == 0, first.stderr[-3000:]
    output = first.stdout + first.stderr
    assert "table public_bad quarantined at batch" in output, output[-3000:]
    assert table_rows(workdir / "tables" / "public_good") == workloads["good"].expected_rows()
    quarantine = json.loads((workdir / "checkpoints" / f"db_{unique}" / "quarantine.json").read_text())
    assert quarantine["public_bad"]["state"] == "quarantined" and "DecodeError" in quarantine["public_bad"]["reason"]
    status = subprocess.run([CLI, "status", str(config)], capture_output=True, text=True, timeout=120)
    assert f"db_{unique}.public_bad" in status.stdout and "[quarantined at batch" in status.stdout, status.stdout

    # The other tables go on while it is set aside.
    good = workloads["good"]
    produce(kafka_bootstrap, good.generate(300, 150))
    second = run_cli(config, "--until-idle")
    assert second.returncode == 0, second.stderr[-3000:]
    assert table_rows(workdir / "tables" / "public_good") == good.expected_rows()

    # The fix (skip undecodable records), then a restart: the table resumes where it stopped, exactly.
    fixed = _database(unique, on_table_error="quarantine",
                      from_changelog={"preset": "debezium", "decode_error_handling": "SKIP"})
    config = _config(workdir, kafka_bootstrap, [fixed])
    third = run_cli(config, "--until-idle")
    assert third.returncode == 0, third.stderr[-3000:]
    assert table_rows(workdir / "tables" / "public_bad") == bad.expected_rows()
    assert table_rows(workdir / "tables" / "public_good") == good.expected_rows()
    assert not json.loads((workdir / "checkpoints" / f"db_{unique}" / "quarantine.json").read_text())


def test_a_table_with_state_or_a_shape_runs_as_its_own_pipeline_beside_the_shared_query(
        kafka_bootstrap, unique, workdir, monkeypatch):
    monkeypatch.setenv(SALT_ENV, SALT)  # the service's processes inherit it
    workloads = _workloads(unique, ["plain", "ordered"])
    workloads["ordered"] = DebeziumWorkload(f"dbs.{unique}.public.ordered", 2, "always", seed=5, with_timestamp=True)
    _load(kafka_bootstrap, workloads, 900, 200)
    shaped = DebeziumWorkload(f"dbs.{unique}.public.shaped", 2, "never", seed=9)  # history, masked, soft deletes
    create_topics(kafka_bootstrap, [shaped.topic], 2)
    events = shaped.generate(600, 150)
    produce(kafka_bootstrap, events)
    database = _database(unique, tables={
        "public_ordered": {"primary_key": ["id"], "sequence_by": ["updated_at"], "on_conflict": "deduplicate",
                           "upsert_materialize": "force"},
        "public_shaped": {"primary_key": ["id"], "history": {"sequence_by": "ts_ms"},
                          "table_shape": {"deletes": "soft"},
                          "columns": {"mask": {"email": "sha256"}, "salt_env": SALT_ENV}}})
    config = _config(workdir, kafka_bootstrap, [database])
    plan = subprocess.run([CLI, "plan", str(config)], capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0 and f"db_{unique}.public_ordered/materializer" in plan.stdout, plan.stdout[-3000:]
    assert f"(own query: pipeline db_{unique}.public_ordered)" in plan.stdout, plan.stdout[-3000:]
    for node in ("history", "table_shape", "columns"):
        assert f"db_{unique}.public_shaped/{node}" in plan.stdout, plan.stdout[-3000:]
    result = run_cli(config, "--until-idle")
    assert result.returncode == 0, result.stderr[-3000:]
    for name, workload in workloads.items():
        assert table_rows(workdir / "tables" / f"public_{name}") == workload.expected_rows(), name
    output = result.stdout + result.stderr
    assert f"pipeline db_{unique}.public_ordered: batch 0 ->" in output, output[-3000:]
    assert f"pipeline db_{unique}.public_shaped: batch 0 ->" in output, output[-3000:]
    assert f"db_{unique}: batch 0 -> 1 table(s)" in output, output[-3000:]

    # The shaped table: live rows masked, deleted keys kept flagged; the history's open versions are the live rows.
    live = [{**row, "email": _hashed(row["email"])} for row in shaped.expected_rows()]
    deleted = {json.loads(event.key)["id"] for event in events} - {row["id"] for row in live}
    current = table_rows(workdir / "tables" / "public_shaped")
    assert [row["id"] for row in current if row["__DELETED"]] == sorted(deleted)
    assert all(row["__DELETED_AT"] is not None for row in current if row["__DELETED"])
    assert [{k: v for k, v in row.items() if k not in SOFT} for row in current if not row["__DELETED"]] == live
    assert all(row["__DELETED_AT"] is None for row in current if not row["__DELETED"])
    history = table_rows(workdir / "tables" / "public_shaped_history")
    open_versions = [{k: v for k, v in row.items() if k not in VALIDITY} for row in history
                     if row["__END_AT"] is None and not row["__DELETED"]]
    assert open_versions == live
    stored = b"".join(path.read_bytes() for name in ("public_shaped", "public_shaped_history")
                      for path in (workdir / "tables" / name).rglob("*") if path.is_file())
    assert b"@example.com" not in stored
