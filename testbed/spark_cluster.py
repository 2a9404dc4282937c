"""A Spark standalone cluster on loopback, started with pyspark's own launcher classes.

`StandaloneCluster(workdir, workers=2)` starts one `org.apache.spark.deploy.master.Master` and
`workers` `org.apache.spark.deploy.worker.Worker` JVMs through `<pyspark>/bin/spark-class`, by
way of the image's entrypoint (`deploy/entrypoint.sh spark-master` / `spark-worker`, the roles
a standalone cluster of the image runs), each in its own process group, waits until the master's JSON status lists every worker ALIVE, and
stops them all on exit (also when start-up fails). Executors the workers launch are children
of their worker, so stopping a worker's group takes its executors with it.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent
ENTRYPOINT = Path(__file__).resolve().parents[1] / "deploy" / "entrypoint.sh"
_LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind((_LOOPBACK, 0))
        return probe.getsockname()[1]


class StandaloneCluster:
    """A master and `workers` workers (1 core, `worker_memory` each) on 127.0.0.1."""

    def __init__(self, workdir: Path, workers: int = 2, worker_memory: str = "1g",
                 start_timeout_s: float = 180.0) -> None:
        self.workdir = workdir
        self.workers = workers
        self.worker_memory = worker_memory
        self.start_timeout_s = start_timeout_s
        self.port = free_port()
        self.webui_port = free_port()
        self._processes: list[subprocess.Popen] = []

    @property
    def master_url(self) -> str:
        """The `spark.master` of an application that runs on this cluster."""
        return f"spark://{_LOOPBACK}:{self.port}"

    @property
    def status_url(self) -> str:
        """The master's status as JSON (workers, running and completed applications)."""
        return f"http://{_LOOPBACK}:{self.webui_port}/json/"

    def application_conf(self, executor_memory: str = "512m") -> dict[str, str]:
        """Spark conf of an application on this cluster: one 1-core executor per worker, the
        driver on loopback, and no task before every executor registered (however long a loaded
        machine takes to start them), so that all of them get work."""
        return {"spark.executor.memory": executor_memory, "spark.executor.cores": "1",
                "spark.driver.host": _LOOPBACK, "spark.driver.bindAddress": _LOOPBACK,
                "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                "spark.scheduler.maxRegisteredResourcesWaitingTime": "300s"}

    def status(self) -> dict:
        """The master's current status."""
        with urllib.request.urlopen(self.status_url, timeout=10) as response:
            return json.load(response)

    def __enter__(self) -> StandaloneCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def _environment(self) -> dict[str, str]:
        # Executors run this interpreter (the project's venv); the JVMs bind loopback only.
        return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": _LOOPBACK,
                "PYSPARK_PYTHON": sys.executable, "SPARK_LOG_DIR": str(self.workdir / "logs")}

    def _launch(self, name: str, *arguments: str) -> None:
        log = open(self.workdir / f"{name}.log", "w")
        self._processes.append(subprocess.Popen(
            ["bash", str(ENTRYPOINT), *arguments], stdout=log, stderr=subprocess.STDOUT, env=self._environment(),
            cwd=self.workdir, start_new_session=True))
        log.close()

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._launch("master", "spark-master", "--host", _LOOPBACK, "--port", str(self.port),
                     "--webui-port", str(self.webui_port))
        for index in range(self.workers):
            scratch = self.workdir / f"worker-{index}"
            scratch.mkdir(exist_ok=True)
            self._launch(f"worker-{index}", "spark-worker", "--host", _LOOPBACK, "--cores", "1",
                         "--memory", self.worker_memory, "--work-dir", str(scratch),
                         "--webui-port", str(free_port()), self.master_url)
        self._wait_for_workers()

    def _wait_for_workers(self) -> None:
        deadline, seen = time.monotonic() + self.start_timeout_s, "no answer"
        while time.monotonic() < deadline:
            for process in self._processes:
                if process.poll() is not None:
                    raise RuntimeError(f"a cluster JVM exited with {process.returncode}: {self.logs()}")
            try:
                alive = [w for w in self.status()["workers"] if w["state"] == "ALIVE"]
                seen = f"{len(alive)} of {self.workers} workers alive"
                if len(alive) >= self.workers:
                    return
            except (OSError, http.client.HTTPException, ValueError, KeyError) as error:
                # the master's web UI is not up yet, or answered while starting (cut short, not JSON)
                seen = f"{type(error).__name__}: {error}"
            time.sleep(0.5)
        raise TimeoutError(f"cluster not up in {self.start_timeout_s:.0f}s ({seen}): {self.logs()}")

    def logs(self, tail: int = 3000) -> str:
        """The end of every cluster JVM's log, for failure messages."""
        return "\n".join(f"--- {log.name}\n{log.read_text()[-tail:]}" for log in sorted(self.workdir.glob("*.log")))

    def executor_logs(self) -> str:
        """Everything the executors wrote (stdout and stderr of every application's executors)."""
        files = sorted(self.workdir.glob("worker-*/app-*/*/std*"))
        return "\n".join(f"--- {path}\n{path.read_text()}" for path in files)

    def stop(self) -> None:
        """Stop workers first (their executors are in their process groups), then the master."""
        for process in reversed(self._processes):
            _stop_group(process)
        self._processes.clear()


def _stop_group(process: subprocess.Popen, grace_s: float = 20.0) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=grace_s)
