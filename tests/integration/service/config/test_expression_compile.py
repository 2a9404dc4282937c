"""`cdc-lakehouse validate` compiles the pipelines' `columns:` expressions with Spark's parser before
anything starts (`plan` runs the same check): each one that does not compile is named with its pipeline
(or database and table) and column, the ones that do are not. One command, one JVM."""

from __future__ import annotations

import subprocess

from tests.support.pipeline_harness import CLI, write_config

GOOD = {"computed": {"domain": "split(email, '@')[1]", "tag": "upper(name) || '-' || CAST(id AS STRING)"},
        "filter": "country IN ('DE', 'AT') AND id > 0"}


def _pipeline(name: str, columns: dict) -> dict:
    return {"name": name, "topics": [name], "table": name, "primary_key": ["id"], "columns": columns}


def test_validate_names_each_expression_that_does_not_compile(tmp_path):
    bad = write_config(tmp_path / "bad.yaml", "127.0.0.1:1", tmp_path, [
        _pipeline("people", {"computed": {"domain": "split(email, '@'", "ok": "lower(name)"}}),
        _pipeline("orders", {"filter": "country = = 'DE'"}),
        _pipeline("plain", GOOD),
    ], databases=[{"name": "inv", "topic_pattern": r"db1\.(?P<table>[^.]+)", "tables": {  # topics not looked up
        "customers": {"primary_key": ["id"], "columns": {"computed": {"initial": "substr(name, 1, 1"}}},
        "orders": {"primary_key": ["id"], "columns": GOOD}}}])
    result = subprocess.run([CLI, "validate", str(bad)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and str(bad) in errors[0], result.stderr
    problems = errors[0].split("; ")
    assert len(problems) == 3, problems
    syntax = "does not compile: [PARSE_SYNTAX_ERROR]"
    assert f"pipeline people: columns: domain: \"split(email, '@'\" {syntax}" in problems[0], problems
    assert f"pipeline orders: columns: filter: \"country = = 'DE'\" {syntax}" in problems[1], problems
    assert f"database inv, table customers: columns: initial: 'substr(name, 1, 1' {syntax}" in problems[2], problems
    assert "columns: ok" not in errors[0] and "pipeline plain" not in errors[0] and "table orders" not in errors[0]
    assert "valid," not in result.stdout

