"""The service package runs without the embedded broker (noida-db, the `demo` extra): the image has none."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]

# Runs the CLI in a fresh interpreter where noida-db cannot be found: its Python package cannot be
# imported and its executable is neither beside the interpreter nor on PATH.
WITHOUT_NOIDA = """
import importlib, importlib.abc, pkgutil, sys

class _Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "noida_db":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _Blocked())
sys.executable = "/nonexistent/bin/python"
import connectors, service
for package in (service, connectors):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(module.name)
assert "noida_db" not in sys.modules
sys.argv = ["cdc-lakehouse", *sys.argv[1:]]
from service.__main__ import main
main()
"""


def _cli_without_noida(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", WITHOUT_NOIDA, *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env)


def test_noida_db_is_only_in_the_demo_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith("noida-db") for dep in project["dependencies"])
    assert any(dep.startswith("noida-db") for dep in project["optional-dependencies"]["demo"])
    assert "install.sh demo" in (ROOT / "scripts" / "demo.sh").read_text()


def test_every_module_imports_and_validate_works_without_noida_db(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("pipelines:\n  - {name: p, topics: [t], table: t, primary_key: [id]}\n")
    done = _cli_without_noida("validate", str(config))
    assert done.returncode == 0, done.stderr
    assert "valid, 1 pipeline(s)" in done.stdout


def test_demo_without_noida_db_names_the_extra(tmp_path: Path) -> None:
    done = _cli_without_noida("demo", "--output", str(tmp_path / "demo"))
    assert done.returncode == 1, done.stderr
    assert "cdc-lakehouse[demo]" in done.stderr and "noida-db" in done.stderr
