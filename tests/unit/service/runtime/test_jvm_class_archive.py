"""Where the JVM class archive lives and when a session maps it (no JVM started here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.runtime import jvm_class_archive as archive


def test_the_directory_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(archive.ARCHIVE_DIR_ENV, str(tmp_path))
    assert archive.archive_dir() == tmp_path
    monkeypatch.setenv(archive.ARCHIVE_DIR_ENV, " ")
    assert archive.archive_dir() is None
    assert archive.archive_path() is None and archive.session_options() == ""
    monkeypatch.delenv(archive.ARCHIVE_DIR_ENV)
    assert archive.archive_dir() == Path.home() / ".cache" / "cdc-lakehouse"


def test_a_session_maps_the_archive_only_once_it_exists(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(archive.ARCHIVE_DIR_ENV, str(tmp_path))
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "spark-core.jar").write_bytes(b"jar")
    archive.pin_jar_times(jars)  # as prepare leaves them
    monkeypatch.setattr(archive, "_jars", lambda: jars)
    path = archive.archive_path()
    assert path is not None and path.parent == tmp_path and path.suffix == ".jsa"
    assert path == archive.archive_path(), "the name is stable for one runtime and one set of jars"
    assert archive.session_options() == ""
    path.write_bytes(b"archive")
    assert f"-XX:SharedArchiveFile={path}" in archive.session_options()
    assert archive.prepare() == path, "an existing archive is kept, not written again"
    assert path.read_bytes() == b"archive"


def test_the_archive_is_keyed_by_the_java_runtime(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(archive.ARCHIVE_DIR_ENV, str(tmp_path))
    java = archive._java()
    if java is None:
        pytest.skip("no java on this machine")
    first = archive.archive_path()
    other = tmp_path / "jdk" / "bin" / "java"
    other.parent.mkdir(parents=True)
    other.write_bytes(b"#!/bin/sh\n")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    assert archive._java() == other.resolve()
    assert archive.archive_path() not in (None, first)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "absent"))
    assert archive._java() is None and archive.archive_path() is None


def test_the_workload_prepare_runs_exists_and_the_archive_module_imports_no_session() -> None:
    import importlib.util

    assert importlib.util.find_spec(archive.WORKLOAD_MODULE) is not None
    source = Path(archive.__file__).read_text()
    assert "spark_session" not in source.split('"""', 2)[2], "the session module imports this one: no cycle back"


def _installed_jar(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """One jar in a Spark jars directory of its own, archives under tmp_path/archives (needs a java)."""
    if archive._java() is None:
        pytest.skip("no java on this machine")
    jars = tmp_path / "jars"
    jars.mkdir()
    jar = jars / "spark-core.jar"
    jar.write_bytes(b"jar")
    monkeypatch.setattr(archive, "_jars", lambda: jars)
    monkeypatch.setenv(archive.ARCHIVE_DIR_ENV, str(tmp_path / "archives"))
    return jar


def test_jars_reinstalled_in_place_name_a_new_archive_and_retire_the_old(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The JVM refuses an archive when a jar's modification time differs from when it was written (a
    # new virtual environment in the same clone): such an archive must not be found again.
    import os

    jar = _installed_jar(monkeypatch, tmp_path)
    first = archive.archive_path()
    assert first is not None
    first.parent.mkdir()
    first.write_bytes(b"archive")
    os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 10**9))
    second = archive.archive_path()
    assert second is not None and second != first, "same name, same size, new time: a new archive"
    other_place = first.parent / "spark-0-otherplace-0123456789ab.jsa"
    other_place.write_bytes(b"archive of another installation")
    assert archive.stale_archives(second) == [first]


def test_prepare_pins_the_jar_times_so_a_reinstall_finds_the_archive_again(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    jar = _installed_jar(monkeypatch, tmp_path)
    jars = jar.parent
    assert archive.pin_jar_times(jars) == 1 and archive.pin_jar_times(jars) == 0
    pinned = archive.archive_path()
    assert pinned is not None
    pinned.parent.mkdir()
    pinned.write_bytes(b"archive")
    jar.write_bytes(b"jar")  # the same jar installed again: the time of the install
    assert archive.archive_path() != pinned
    assert archive.prepare() == pinned, "prepare pins the times again and finds the archive, writing nothing"
    assert pinned.read_bytes() == b"archive"
