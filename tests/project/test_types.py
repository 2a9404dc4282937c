"""mypy over service/ and connectors/ (settings in pyproject.toml) in CI.

Above all it holds both Delta engines to the whole `DeltaEngineTable` protocol: an engine
that misses a method or a parameter the sink passes fails here, not on a user's first
source TRUNCATE.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600
BROKEN_ENGINE = '''
import pyarrow as pa

from connectors.delta.engines import DeltaEngineTable


class HalfEngine:
    """Has every member but truncate(), and a merge() without the truncate parameter."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def schema(self) -> pa.Schema | None:
        return None

    def last_batch(self, app_id: str) -> int | None:
        return None

    def version(self) -> int | None:
        return None

    def configuration(self) -> dict[str, str]:
        return {}

    def rows_with_keys(self, keys: pa.Table) -> pa.Table:
        return keys

    def create(self, schema: pa.Schema) -> None:
        pass

    def widen(self, columns: dict[str, pa.DataType], app_id: str, batch_id: int) -> None:
        pass

    def create_with(self, changes: pa.Table, primary_key: tuple[str, ...], app_id: str, batch_id: int) -> None:
        pass

    def merge(self, changes: pa.Table, primary_key: tuple[str, ...], app_id: str, batch_id: int) -> None:
        pass


table: DeltaEngineTable = HalfEngine("t")
'''


def _mypy(*args: str) -> subprocess.CompletedProcess[str]:
    # No cache: every run checks from scratch and several runs may share the tree.
    command = [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"), "--cache-dir", "/dev/null"]
    return subprocess.run([*command, *args], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)


def test_service_and_connectors_type_check():
    result = _mypy()
    assert result.returncode == 0, (
        f"mypy found type errors (fix them; for a file under rework by someone else, a per-module "
        f"disable_error_code override in pyproject.toml):\n{result.stdout}{result.stderr}"
    )


def test_an_engine_missing_part_of_the_protocol_fails_the_check(tmp_path):
    probe = tmp_path / "half_engine.py"
    probe.write_text(BROKEN_ENGINE)
    result = _mypy(str(probe))
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'Incompatible types in assignment (expression has type "HalfEngine"' in result.stdout
    assert 'missing following "DeltaEngineTable" protocol member:' in result.stdout
    assert "batch_id: int, truncate: bool = ...) -> None" in result.stdout  # merge's conflict, shown
