"""A class-data-sharing archive for the local Spark JVM: start-up without reading Spark's classes from jars.

A local Spark driver loads tens of thousands of classes from Spark's jars before its first
micro-batch, and loading them (reading, parsing, verifying) is most of the JVM's start-up on a
small machine. Java 17 can write the classes a JVM loaded into an archive when it exits
(`-XX:ArchiveClassesAtExit`) and map that archive at the next start (`-XX:SharedArchiveFile`).

`prepare()` (the `cdc-lakehouse prepare` command; scripts/install.sh and the image build run it)
starts a local session once in a process of its own with a small workload that loads what the
service's queries load (`class_archive_workload`: SQL and a shuffle, Arrow batches through Python, a
streaming query over a Python data source with a state store), waits for its JVM to write the
archive, and keeps it under a name keyed by the Java runtime and Spark's jars (each jar's size and
modification time, as the JVM checks them; `prepare` first gives the jars one fixed time, so that a
reinstall of the same Spark finds the archive again). `session_options()` gives a local session the option
that maps it when it exists. The JVM checks an archive against its own runtime and class path and goes on
without it when they differ (`-Xshare:auto`, the default): a stale archive costs nothing but the
gain. Executors of a cluster are started by their workers and do not use it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from service.config.sources import ARCHIVE_DIR_ENV, jvm_archive_dir

log = logging.getLogger(__name__)

WORKLOAD_MODULE = "service.runtime.class_archive_workload"
"""The module `prepare` runs (by name: it builds a session, and the session module imports this one)."""
DUMP_TIMEOUT_S = 600
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # a mismatch or a skipped class is not worth a line on stdout


def archive_dir() -> Path | None:
    """The directory of the archives; None when turned off."""
    configured = jvm_archive_dir()
    if configured is not None:
        return Path(configured) if configured.strip() else None
    return Path.home() / ".cache" / "cdc-lakehouse"


def _java() -> Path | None:
    """The java executable Spark's launcher will run (JAVA_HOME first, as spark-class does)."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def _jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def archive_path() -> Path | None:
    """The archive for this Java runtime and these Spark jars; None when archives are off or no java is found.

    The name has two parts: one for where Spark is installed, one for what is installed there, down
    to each jar's size and modification time (what the JVM checks before it maps an archive). A
    reinstall over the same path (a new virtual environment in the same clone) thus names a new
    archive rather than finding one the JVM would refuse.
    """
    directory, java = archive_dir(), _java()
    if directory is None or java is None:
        return None
    import pyspark

    jars = _jars()
    place = hashlib.sha256(f"{java}\0{jars}".encode()).hexdigest()[:8]
    content = hashlib.sha256()
    for part in (str(java.stat().st_size), str(java.stat().st_mtime_ns), pyspark.__version__):
        content.update(part.encode() + b"\0")
    for jar in sorted(jars.glob("*.jar")):
        stat = jar.stat()
        content.update(f"{jar.name}:{stat.st_size}:{stat.st_mtime_ns}".encode() + b"\0")
    return directory / f"spark-{pyspark.__version__}-{place}-{content.hexdigest()[:12]}.jsa"


JAR_TIME_NS = 946_684_800 * 10**9
"""The modification time `prepare` gives Spark's jars (2000-01-01): Spark never reads it, the JVM
compares it with the archive's record, and an installer writes the time of the install."""


def pin_jar_times(jars: Path) -> int:
    """Set every jar's modification time under `jars` to JAR_TIME_NS (where allowed); how many changed.

    A reinstall of the same pyspark (a new virtual environment in the same place) then finds the
    archive written before it, instead of writing it again; a jar replaced later has the time of its
    writing again, so the archive's name changes and the JVM is never shown an archive it refuses.
    """
    changed = 0
    for jar in jars.glob("*.jar"):
        stat = jar.stat()
        if stat.st_mtime_ns != JAR_TIME_NS:
            try:
                os.utime(jar, ns=(stat.st_atime_ns, JAR_TIME_NS))
                changed += 1
            except PermissionError:
                return changed
    return changed


def stale_archives(path: Path) -> list[Path]:
    """Archives written earlier for the same installation place as `path`, for jars no longer there."""
    place = path.name.rsplit("-", 1)[0]
    return sorted(p for p in path.parent.glob(f"{place}-*.jsa") if p != path)


def session_options() -> str:
    """JVM options that map the archive, when one was prepared ('' otherwise)."""
    path = archive_path()
    if path is None or not path.is_file():
        return ""
    return f"-XX:SharedArchiveFile={path} {_QUIET}"


def dump_options(target: Path) -> str:
    """JVM options that write the classes the JVM loaded to `target` when it exits."""
    return f"-XX:ArchiveClassesAtExit={target} {_QUIET}"


def prepare() -> Path | None:
    """Write the archive unless it exists; its path (None when archives are off or it could not be written).

    The workload runs in a process of its own so that its JVM exits (and writes the archive) before
    the archive is put in place: a reader never maps a file that is still being written. Spark's jars
    get one fixed modification time first (`pin_jar_times`).
    """
    if archive_dir() is not None and _java() is not None:
        pin_jar_times(_jars())
    path = archive_path()
    if path is None:
        log.info("no JVM class archive: turned off (%s) or no java found", ARCHIVE_DIR_ENV)
        return None
    if path.is_file():
        log.info("JVM class archive: %s", path)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in stale_archives(path):
        log.info("JVM class archive of replaced jars removed: %s", stale)
        stale.unlink(missing_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        done = subprocess.run([sys.executable, "-m", WORKLOAD_MODULE, str(partial)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=DUMP_TIMEOUT_S, check=False)
        if done.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
            tail = done.stdout.decode(errors="replace")[-2000:]
            log.warning("JVM class archive not written (exit %d); start-up goes on without it:\n%s",
                        done.returncode, tail)
            return None
        os.replace(partial, path)
    except subprocess.TimeoutExpired:
        log.warning("JVM class archive not written within %d s; start-up goes on without it", DUMP_TIMEOUT_S)
        return None
    finally:
        partial.unlink(missing_ok=True)
    log.info("JVM class archive written: %s (%.0f MiB)", path, path.stat().st_size / 2**20)
    return path
