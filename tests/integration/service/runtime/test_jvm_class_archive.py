"""The JVM class archive: written by `prepare`, mapped by the driver's JVM, and harmless when broken."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.runtime import jvm_class_archive as archive

# A session with the archive's options, optionally demanding that the JVM maps it (-Xshare:on
# makes the JVM refuse to start when it cannot).
_SESSION = """
import sys
import service.runtime.jvm_class_archive as archive
if sys.argv[1] == "demand":
    archive._QUIET = "-Xshare:on"
from service.runtime.jvm_profiles import LIGHT
from service.runtime.spark_session import build_spark
print("rows", build_spark(jvm=LIGHT).range(7).count())
"""


def _session(directory: Path, mode: str) -> subprocess.CompletedProcess:
    env = {**os.environ, archive.ARCHIVE_DIR_ENV: str(directory)}
    return subprocess.run([sys.executable, "-c", _SESSION, mode], env=env, capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.mark.slow
def test_the_installed_archive_is_mapped_by_the_driver_jvm() -> None:
    # scripts/install.sh runs `prepare` (a whole Spark workload in a JVM of its own, about 90 s here)
    # before the suite: on CI's fresh machine that run writes the archive this test finds. Running the
    # workload a second time here would prove the same thing again.
    path = archive.archive_path()
    assert path is not None and path.is_file(), f"scripts/install.sh should have prepared {path}"
    assert path.stat().st_size > 10 * 2**20
    assert not list(path.parent.glob(f"{path.name}.*.partial")), "no partial file is left behind"
    assert archive.prepare() == path, "an existing archive is kept, not written again"
    demanded = _session(path.parent, "demand")
    assert demanded.returncode == 0 and "rows 7" in demanded.stdout, demanded.stdout + demanded.stderr


def test_a_broken_archive_costs_only_the_gain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(archive.ARCHIVE_DIR_ENV, str(tmp_path))
    path = archive.archive_path()
    assert path is not None
    path.write_bytes(os.urandom(4096))
    demanded = _session(tmp_path, "demand")
    assert demanded.returncode != 0, "the check below would pass without the archive being used"
    tolerated = _session(tmp_path, "auto")
    assert tolerated.returncode == 0 and "rows 7" in tolerated.stdout, tolerated.stdout + tolerated.stderr
