"""Ingest on a Spark standalone cluster: executors in their own JVMs read Kafka, decode, keep the
materializer's state and run Delta's MERGE.

The cluster (a master and two workers of one core each, `testbed.spark_cluster`) runs on loopback;
the service is the real CLI in its own process with `spark.master: spark://...` and `engine:
delta-spark`, the project's dependencies shipped to the executors as a packed environment
(`scripts/pack_executor_env.sh`, `spark.archives`; kept in a cache outside the clone, as it changes
only with the dependencies) and its code by the service itself (`service.runtime.project_code`), the
way executors on machines without the project get them. One run serves every test of the module (a
plain and a materializer pipeline); the application's event log says which executors ran which
tasks.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from service.operations.workload import DebeziumWorkload, create_topics, produce
from service.runtime.project_code import ZIP_NAME
from testbed.spark_cluster import StandaloneCluster
from tests.support.pipeline_harness import CLI, table_rows, write_config

ENV_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cdc-lakehouse" / "executor-env"
"""Packed dependencies kept between runs (outside the clone, as the jars are): the archive changes only
with what `dependencies_key` covers, since the project's code goes to the executors with the session."""
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pack_executor_env.sh"


def dependencies_key() -> str:
    """What the packed archive depends on: the script, the pinned dependencies, the packing Python."""
    with open(SCRIPT.parents[1] / "pyproject.toml", "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    digest = hashlib.sha256(SCRIPT.read_bytes())
    for part in (*dependencies, sys._base_executable, sys.version):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


@dataclass
class Packing:
    """The packed dependencies: an archive of the cache, or scripts/pack_executor_env.sh writing one."""

    archive: Path
    log: Path
    process: subprocess.Popen | None = None

    def wait(self) -> Path:
        """The archive, once the script (if it had to run) has finished; kept in the cache."""
        if self.process is not None:
            returncode = self.process.wait(timeout=900)
            assert returncode == 0 and self.archive.exists(), self.log.read_text()[-5000:]
            for stale in ENV_CACHE.glob("deps-*.tar.gz"):
                if stale != self.archive:
                    stale.unlink()
            self.process = None
        return self.archive


@pytest.fixture(scope="module")
def packing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Packing]:
    """The executors' dependencies: from the cache, or packed by scripts/pack_executor_env.sh (without
    pyspark), started first so that it packs while the cluster starts and the workload is produced."""
    archive = ENV_CACHE / f"deps-{dependencies_key()}.tar.gz"
    log = tmp_path_factory.mktemp("packed") / "pack.log"
    if archive.exists():
        yield Packing(archive, log)
        return
    ENV_CACHE.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f"partial-{os.getpid()}-{archive.name}")  # venv-pack reads the format from the name
    with open(log, "w") as output:  # packed under another name, renamed whole: a reader never sees a part
        process = subprocess.Popen(["bash", "-c", 'bash "$0" "$1" && mv "$1" "$2"', str(SCRIPT), str(partial),
                                    str(archive)], stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "PYTHON": sys._base_executable})
    yield Packing(archive, log, process)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    partial.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def cluster(packing, tmp_path_factory: pytest.TempPathFactory):
    """Two workers on loopback for the tests of this module (the packing started before them)."""
    with StandaloneCluster(tmp_path_factory.mktemp("cluster"), workers=2) as running:
        yield running


def event_log(directory: Path) -> dict[str, str]:
    """Spark conf for one plain (uncompressed, single-file) JSON event log in `directory`."""
    return {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(directory),
            "spark.eventLog.rolling.enabled": "false", "spark.eventLog.compress": "false"}


def _loaded(bootstrap: str, topic: str, seed: int, events: int, keys: int) -> DebeziumWorkload:
    """A Debezium workload (schema mixed in) produced to its own topic of two partitions."""
    workload = DebeziumWorkload(topic, 2, "mixed", seed=seed)
    create_topics(bootstrap, [workload.topic], 2)
    produce(bootstrap, workload.generate(events, keys))
    return workload


def _log_events(event_log_dir: Path) -> list[dict]:
    """The events of the one application event log in `event_log_dir`."""
    (log,) = event_log_dir.iterdir()
    return [json.loads(line) for line in log.read_text().splitlines()]


def _executors_by_stage(events: list[dict]) -> dict[int, set[str]]:
    """Executor ids of the successful tasks of every stage."""
    executors: dict[int, set[str]] = {}
    for event in events:
        if event["Event"] == "SparkListenerTaskEnd" and event["Task End Reason"]["Reason"] == "Success":
            executors.setdefault(event["Stage ID"], set()).add(event["Task Info"]["Executor ID"])
    return executors


def executors_per_stage(event_log_dir: Path) -> list[tuple[set[str], set[str]]]:
    """(plan operators, executor ids of its successful tasks) of every stage, from the event log."""
    events = _log_events(event_log_dir)
    operators = {event["Stage Info"]["Stage ID"]: {json.loads(rdd["Scope"])["name"]
                                                   for rdd in event["Stage Info"]["RDD Info"] if rdd.get("Scope")}
                 for event in events if event["Event"] == "SparkListenerStageSubmitted"}
    return [(operators[stage], ran) for stage, ran in _executors_by_stage(events).items()]


@pytest.fixture(scope="module")
def packed_run(packing, cluster, kafka_bootstrap, tmp_path_factory) -> dict:
    """One `run --until-idle` on the cluster: delta-spark, the packed environment, a plain pipeline in
    several micro-batches and a materializer pipeline over one Debezium topic of two partitions."""
    workdir = tmp_path_factory.mktemp("cluster_run")
    workload = _loaded(kafka_bootstrap, f"cluster-{uuid.uuid4().hex[:10]}", 11, 2000, 200)
    packed_environment = packing.wait()
    events = workdir / "events"
    events.mkdir()
    config = write_config(
        workdir / "c.yaml", kafka_bootstrap, workdir,
        [{"name": "p", "topics": [workload.topic], "table": "t", "primary_key": ["id"],
          "max_offsets_per_trigger": 1000},
         {"name": "m", "topics": [workload.topic], "table": "m", "primary_key": ["id"], "upsert_materialize": "force"}],
        engine="delta-spark",
        spark={"master": cluster.master_url, "shuffle_partitions": 2,
               "conf": {**cluster.application_conf(), **event_log(events),
                        "spark.archives": f"{packed_environment}#environment"}})
    # Python workers run ./environment/bin/python: on an executor, the archive Spark unpacked in
    # its directory; on the driver (which plans the Kafka source in Python too), its own
    # environment under the same name in the directory it runs from.
    (workdir / "environment").symlink_to(sys.prefix)

    log = workdir / "cli.log"
    with open(log, "w") as output:
        result = subprocess.run([CLI, "run", str(config), "--until-idle"], stdout=output, stderr=subprocess.STDOUT,
                                timeout=1200, cwd=workdir,
                                env={**os.environ, "PYSPARK_PYTHON": "./environment/bin/python"})

    assert result.returncode == 0, log.read_text()[-3000:] + cluster.logs() + cluster.executor_logs()[-3000:]
    return {"workdir": workdir, "workload": workload, "events": events, "log": log.read_text()}


@pytest.mark.slow
def test_ingest_runs_on_standalone_executors(packed_run):
    workdir, workload = packed_run["workdir"], packed_run["workload"]
    assert table_rows(workdir / "tables" / "t") == workload.expected_rows()
    assert table_rows(workdir / "tables" / "m") == workload.expected_rows()
    stages = executors_per_stage(packed_run["events"])
    # Every task ran on the two executors (never the driver), and both of them ran tasks of the
    # stages that read Kafka (the project's Python source readers). The two pipelines' stages
    # run at the same time, so one stage's tasks may all land on one executor.
    assert set().union(*(ran for _, ran in stages)) == {"0", "1"}, stages
    reading = [ran for operators, ran in stages if "MicroBatchScan" in operators]
    assert set().union(*reading) == {"0", "1"}, stages
    # The materializer's executors decoded and kept keyed state: the event times their decode
    # tasks reported through the accumulator reached the driver's progress file, per partition.
    progress = json.loads((workdir / "checkpoints" / "m" / "event_time_progress.json").read_text())
    assert set(progress[workload.topic]) == {"0", "1"}, progress


@pytest.mark.slow
def test_executors_run_the_driver_s_code_in_a_packed_environment(cluster, packed_run):
    # The module's one application: the master lists it once its driver left.
    deadline = time.monotonic() + 120
    while not (apps := cluster.status()["completedapps"]):
        assert time.monotonic() < deadline, cluster.status()
        time.sleep(0.5)
    assert [app["name"] for app in apps] == ["cdc-lakehouse"], apps
    # Both executors of the run unpacked the archive in their directories: the dependencies, not the
    # project, whose code each executor fetched from the driver (and ran: the tables above are whole).
    executors = sorted(cluster.workdir.glob(f"worker-*/{apps[0]['id']}/*"))
    assert len(executors) == 2 and all((e / "environment" / "bin" / "python").exists() for e in executors), executors
    for executor in executors:
        (site_packages,) = executor.glob("environment/lib/python*/site-packages")
        assert (site_packages / "pyarrow").is_dir() and not (site_packages / "service").exists()
        assert (executor / ZIP_NAME).is_file(), sorted(p.name for p in executor.iterdir())


def executors_per_job(event_log_dir: Path) -> dict[str, set[str]]:
    """Executor ids of the successful tasks of every job, by the job's description (Delta describes its
    commands' jobs, e.g. "batch = 3 - MERGE operation - scanning files for matches"), from the event log."""
    events = _log_events(event_log_dir)
    descriptions = {stage: (event.get("Properties") or {}).get("spark.job.description") or ""
                    for event in events if event["Event"] == "SparkListenerJobStart" for stage in event["Stage IDs"]}
    jobs: dict[str, set[str]] = {}
    for stage, ran in _executors_by_stage(events).items():
        jobs.setdefault(descriptions.get(stage, ""), set()).update(ran)
    return jobs


@pytest.mark.slow
def test_delta_spark_merges_on_standalone_executors(packed_run, spark):
    """With `engine: delta-spark` the service ships the Delta jars to the executors (spark.jars) and
    Delta's MERGE runs there: every task of the jobs Delta describes as its MERGE ran on an executor."""
    uri, workload = packed_run["workdir"] / "tables" / "t", packed_run["workload"]
    assert "pipeline p: batch 1 -> " in packed_run["log"], "the plain pipeline was to take several micro-batches"
    by_spark = [row.asDict() for row in spark.read.format("delta").load(str(uri)).orderBy("id").collect()]
    assert by_spark == workload.expected_rows()  # Delta's own reader
    jobs = executors_per_job(packed_run["events"])
    merges = {description: ran for description, ran in jobs.items() if "MERGE operation" in description}
    assert merges, sorted(jobs)
    assert set().union(*merges.values()) <= {"0", "1"} and "driver" not in set().union(*jobs.values()), merges
