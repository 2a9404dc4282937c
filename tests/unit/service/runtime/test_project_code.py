"""The project's code as the driver ships it to a cluster's executors (no session started here)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from service.runtime import project_code


def test_the_zip_holds_every_package_as_imported_here_and_no_bytecode(tmp_path: Path) -> None:
    target = project_code.write_zip(tmp_path / project_code.ZIP_NAME)
    names = set(zipfile.ZipFile(target).namelist())
    for directory in project_code.package_dirs():
        sources = {str(p.relative_to(directory.parent)) for p in directory.rglob("*.py") if "__pycache__" not in p.parts}
        assert sources and sources <= names, directory
    assert "service/runtime/log4j2.properties" in names, "package data goes too"
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_a_python_worker_imports_the_project_from_the_zip_before_an_installed_copy(tmp_path: Path) -> None:
    # What an executor's Python worker does with a file of addPyFile: the zip on its path, ahead of its
    # site-packages (where this machine has the project installed too).
    target = project_code.write_zip(tmp_path / project_code.ZIP_NAME)
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import service.runtime.project_code as m, "
             "vocabulary, connectors; print(m.__file__)")
    done = subprocess.run([sys.executable, "-c", probe, str(target)], capture_output=True, text=True,
                          cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(target)), done.stdout


def test_only_a_cluster_gets_the_code() -> None:
    assert not project_code.runs_on_cluster("local[2]") and not project_code.runs_on_cluster("local")
    assert project_code.runs_on_cluster("spark://127.0.0.1:7077")
    assert project_code.runs_on_cluster("k8s://https://kubernetes.default.svc")
