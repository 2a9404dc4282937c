"""The checkpoint fixture written by commit 41c9bfd (the tree before the regrouping), and how it was made.

`tests/e2e/fixtures/checkpoint_41c9bfd/` holds what the service at 41c9bfd left after
`cdc-lakehouse run CONFIG --until-idle` over the first `FIRST` records of a deterministic Debezium
workload (`DebeziumWorkload(TOPIC, PARTITIONS, "always", SEED)`): each pipeline's checkpoint (Spark's
offset and commit logs, the state store, the stored `plan.json`) and its Delta table. Spark's state
metadata and delta-rs's commit info name the directory the run wrote to: the fixture holds `ROOT`
there, and `install()` puts the directory it is copied to in its place (as if the old run had written
there). Records carry fixed timestamps (`T0` + 1 s per record), so event time, the watermark and the
state TTLs are the same on every run; the topic keeps them for ever (`retention.ms` -1).

Regenerate (about 3 minutes; a broker from the Maven jar cache, the old code from a worktree):

    git -C /work/main worktree add /tmp/old41 41c9bfd
    cd /work/main && .venv/bin/python -m tests.support.old_checkpoint --old-tree /tmp/old41 \\
        --out tests/e2e/fixtures/checkpoint_41c9bfd
    git -C /work/main worktree remove --force /tmp/old41

The old CLI runs as `python -m service run` with the old tree first on PYTHONPATH and as working
directory (the venv's editable install of this tree comes after it), and it is checked to import
from there.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

OLD_COMMIT = "41c9bfd"
TOPIC = "compat.people"
PARTITIONS = 2
SEED = 25
KEYS = 60
FIRST = 300  # records in the old run
REST = 300  # records the new code reads on resume
BATCH = 100  # max_offsets_per_trigger: several micro-batches in each run
T0 = 1_790_000_000_000  # epoch ms of the first record (the workload's own ts_ms start)
ROOT = "@FIXTURE_ROOT@"  # the old run's directory, in the fixture's text files
TABLES, CHECKPOINTS = "tables", "checkpoints"
# Every shape with a checkpoint of its own: keyed state under sequence_by (and tombstones), a
# materializer whose primary key differs from the topic's upsert key, and the plain path.
PIPELINES = [
    {"name": "people", "topics": [TOPIC], "table": "people", "primary_key": ["id"], "sequence_by": ["ts_ms"],
     "on_conflict": "deduplicate", "tombstone_retention_seconds": 86400, "state_ttl_seconds": 86400,
     "from_changelog": {"preset": "debezium"}, "max_offsets_per_trigger": BATCH},
    {"name": "by_email", "topics": [TOPIC], "table": "by_email", "primary_key": ["email"], "upsert_key": ["id"],
     "on_conflict": "error", "state_ttl_seconds": 86400, "from_changelog": {"preset": "debezium"},
     "max_offsets_per_trigger": BATCH},
    {"name": "plain", "topics": [TOPIC], "table": "plain", "primary_key": ["id"],
     "from_changelog": {"preset": "debezium"}, "max_offsets_per_trigger": BATCH},
]


def config(path: Path, bootstrap: str, root: Path) -> Path:
    """The config both trees run: tables and checkpoints below `root`."""
    document = {
        "kafka": {"bootstrap_servers": bootstrap},
        "lakehouse": {"root": str(root / TABLES), "engine": "delta-rs"},
        "checkpoint_root": str(root / CHECKPOINTS),
        "spark": {"master": "local[2]", "shuffle_partitions": 2},
        "pipelines": PIPELINES,
    }
    path.write_text(yaml.safe_dump(document))
    return path


def workload_events(first: bool):
    """The records of the first run (`first`) or those after it, always generated the same way."""
    from service.operations.workload import DebeziumWorkload

    workload = DebeziumWorkload(TOPIC, PARTITIONS, "always", seed=SEED)
    events = workload.generate(FIRST + REST, KEYS)
    return workload, (events[:FIRST] if first else events[FIRST:])


def reset_topic(bootstrap: str) -> None:
    """(Re)create `TOPIC`, empty, with `PARTITIONS` partitions, keeping records of any age."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if TOPIC in admin.list_topics(timeout=10).topics:
        admin.delete_topics([TOPIC], operation_timeout=30)[TOPIC].result()
        while TOPIC in admin.list_topics(timeout=10).topics:
            time.sleep(0.2)
    deadline = time.monotonic() + 60
    while True:  # a deleted topic's name is taken until the broker has removed it
        try:
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1, config={"retention.ms": "-1"})],
                                operation_timeout=30)[TOPIC].result()
            return
        except Exception:  # noqa: BLE001 - retried until the deadline
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def produce(bootstrap: str, first: bool) -> int:
    """Produce the first run's records (`first`) or the rest, in order, with their fixed timestamps."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    start = 0 if first else FIRST
    _, events = workload_events(first)
    for index, event in enumerate(events, start):
        producer.produce(event.topic, key=event.key, value=event.value, partition=event.partition,
                         timestamp=T0 + index * 1000)
    assert producer.flush(60) == 0, "records not acknowledged"
    return len(events)


def install(fixture: Path, target: Path) -> None:
    """Copy the fixture to `target`, naming `target` where the old run named its own directory."""
    shutil.copytree(fixture, target, dirs_exist_ok=True)
    for path in target.rglob("*"):
        if path.is_file() and path.suffix not in (".parquet", ".sst", ".zip", ".changelog"):
            text = path.read_bytes()
            if ROOT.encode() in text:
                path.write_bytes(text.replace(ROOT.encode(), str(target).encode()))


def _run_old_cli(old_tree: Path, config_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(old_tree)}
    probe = subprocess.run([sys.executable, "-c", "import service; print(service.__file__)"], cwd=old_tree,
                           env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.startswith(str(old_tree)), f"the old tree does not win on sys.path: {probe.stdout}"
    done = subprocess.run([sys.executable, "-m", "service", "run", str(config_path), "--until-idle"],
                          cwd=old_tree, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    print(done.stderr[-2000:])


def _keep(work: Path, out: Path) -> None:
    """Checkpoints (without Spark's .crc files) and tables into `out`, `work` replaced by `ROOT`."""
    if out.exists():
        shutil.rmtree(out)
    ignore = shutil.ignore_patterns("*.crc")
    shutil.copytree(work / CHECKPOINTS, out / CHECKPOINTS, ignore=ignore)
    shutil.copytree(work / TABLES, out / TABLES, ignore=ignore)
    for path in out.rglob("*"):
        text = path.read_bytes() if path.is_file() else b""
        if str(work).encode() in text:
            assert path.suffix not in (".parquet", ".sst", ".zip", ".changelog"), f"{path} names {work}"
            path.write_bytes(text.replace(str(work).encode(), ROOT.encode()))


def main() -> None:
    """Produce the first records, run the old CLI over them, keep what it wrote."""
    from connectors.kafka.apache_broker import ApacheKafkaBroker

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-tree", type=Path, required=True, help=f"a worktree of {OLD_COMMIT}")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        with ApacheKafkaBroker(work / "broker") as broker:
            reset_topic(broker.bootstrap_servers)
            produce(broker.bootstrap_servers, first=True)
            _run_old_cli(args.old_tree.resolve(), config(work / "config.yaml", broker.bootstrap_servers, work))
        _keep(work, args.out.resolve())


if __name__ == "__main__":
    main()
