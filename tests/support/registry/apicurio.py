"""Apicurio Registry (its Quarkus app from the Maven jar cache) as a subprocess on 127.0.0.1.

A real Confluent-compatible Schema Registry for the tests: Confluent clients, the project's own
`SchemaRegistryClient` over `confluent_kafka.schema_registry` included, talk to its ccompat API
(`<base>/apis/ccompat/v7`). Storage is the app's default, an in-memory H2 database, so every start
is empty. The app's runtime is `connectors.maven_jars` component `apicurio` (the version is
`APICURIO_VERSION` there, as in docker-compose.yml). Apicurio 3.x is compiled for Java 21: the
launcher takes the first Java 21 or newer of `APICURIO_JAVA`, `JAVA_HOME`, `java` on the PATH and
the JDKs under /usr/lib/jvm.

Differences from a Confluent registry's defaults that the launcher removes: the global
compatibility rule is BACKWARD (Apicurio's default is none, Confluent's is BACKWARD), and the
management interface (health, metrics), fixed on at build time, listens on a free loopback port
instead of 0.0.0.0:9000. Ready means `GET /subjects` answers 200.

The session fixture `apicurio_registry_url` starts one registry per test run, on the first test
that asks for it; SCHEMA_REGISTRY_URL, when set, names a running registry to use instead.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest
import requests

from connectors.kafka.local_broker import free_port
from connectors.maven_jars import JarsUnavailable, archive_dir
from connectors.subprocesses import stop_group

CCOMPAT_PATH = "/apis/ccompat/v7"
MIN_JAVA = 21
_READY_TIMEOUT_S = 300.0  # about 30 s on an idle 2-core machine; far more when the machine is loaded
_STOP_TIMEOUT_S = 60.0
_JVM_OPTIONS = ("-XX:+UseSerialGC", "-Djava.awt.headless=true")


def _java_major(java: str) -> int:
    """The major version of a `java` executable; 0 when it does not run."""
    try:
        shown = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60).stderr
    except (OSError, subprocess.SubprocessError):
        return 0
    found = re.search(r'version "(\d+)', shown)
    return int(found[1]) if found else 0


def find_java(minimum: int = MIN_JAVA) -> str:
    """The first Java runtime of at least `minimum`; JarsUnavailable when the machine has none."""
    candidates = [os.environ.get("APICURIO_JAVA", "")]
    if os.environ.get("JAVA_HOME"):
        candidates.append(str(Path(os.environ["JAVA_HOME"]) / "bin" / "java"))
    candidates += ["java", *sorted(str(p) for p in Path("/usr/lib/jvm").glob("*/bin/java"))]
    for java in filter(None, candidates):
        if _java_major(java) >= minimum:
            return java
    raise JarsUnavailable(f"Apicurio Registry needs Java {minimum} or newer; none found (set APICURIO_JAVA)")


class ApicurioRegistry:
    """One Apicurio Registry JVM owned by this process; its log is `<data_dir>/apicurio.log`."""

    def __init__(self, data_dir: str | Path, java: str | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.java = java or find_java()
        self.port, self.management_port = free_port(), free_port()
        self._process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The Confluent-compatible base URL, for `SchemaRegistryClient` and Confluent clients."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"

    @property
    def pid(self) -> int | None:
        """The registry JVM's process id while it runs."""
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    def _command(self) -> list[str]:
        return [self.java, *_JVM_OPTIONS,
                "-Dquarkus.http.host=127.0.0.1", f"-Dquarkus.http.port={self.port}",
                "-Dquarkus.management.host=127.0.0.1", f"-Dquarkus.management.port={self.management_port}",
                "-Dapicurio.rules.global.compatibility=BACKWARD",
                "-jar", str(archive_dir("apicurio", "apicurio-registry-app") / "quarkus-run.jar")]

    def start(self) -> "ApicurioRegistry":
        """Start the JVM and wait until the ccompat API answers."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / "apicurio.log", "ab") as log:
            self._process = subprocess.Popen(self._command(), cwd=self.data_dir, stdout=log,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True)
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"Apicurio Registry exited early; see {self.data_dir / 'apicurio.log'}")
            try:
                if requests.get(f"{self.url}/subjects", timeout=5).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"Apicurio Registry did not answer on {self.url} in {_READY_TIMEOUT_S:.0f} s")

    def stop(self) -> None:
        """SIGTERM (Quarkus shuts down gracefully), SIGKILL if it hangs."""
        process, self._process = self._process, None
        stop_group(process, signal.SIGTERM, _STOP_TIMEOUT_S)

    def __enter__(self) -> "ApicurioRegistry":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture(scope="session")
def apicurio_registry_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Confluent-compatible URL of a real registry: SCHEMA_REGISTRY_URL, else Apicurio started here."""
    if os.environ.get("SCHEMA_REGISTRY_URL"):
        yield os.environ["SCHEMA_REGISTRY_URL"]
        return
    with ApicurioRegistry(tmp_path_factory.mktemp("apicurio")) as registry:
        yield registry.url
