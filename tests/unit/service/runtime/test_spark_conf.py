"""The Spark settings kept for speed (no Spark started: `spark_conf` is what `build_spark` applies)."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.config.settings import SparkSettings
from service.runtime import jvm_class_archive as archive
from service.runtime.spark_session import CHECKPOINT_FILE_MANAGER, FILE_SYSTEM_MANAGER, spark_conf

LOCAL = SparkSettings(master="local[2]", shuffle_partitions=3)


def test_state_store_commits_write_changelogs():
    assert spark_conf(LOCAL)["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] == "true"


def test_local_checkpoints_are_written_without_hadoops_file_context():
    for root in ("./.cdc-lakehouse/checkpoints", "/var/lib/cdc/checkpoints", "file:///data/checkpoints"):
        assert spark_conf(LOCAL, checkpoint_root=root)[CHECKPOINT_FILE_MANAGER] == FILE_SYSTEM_MANAGER, root
    for root in ("s3a://bucket/checkpoints", "abfss://c@account.dfs.core.windows.net/cp", None):
        assert CHECKPOINT_FILE_MANAGER not in spark_conf(LOCAL, checkpoint_root=root), root
    chosen = SparkSettings(master="local[2]", conf={CHECKPOINT_FILE_MANAGER: "com.example.Manager"})
    assert spark_conf(chosen, checkpoint_root="/cp")[CHECKPOINT_FILE_MANAGER] == "com.example.Manager"


def test_python_workers_are_reused_and_adaptive_execution_is_off():
    conf = spark_conf(LOCAL)
    assert conf["spark.python.worker.reuse"] == "true" and conf["spark.sql.adaptive.enabled"] == "false"
    assert conf["spark.sql.shuffle.partitions"] == conf["spark.default.parallelism"] == "3"


def test_delta_spark_rebuilds_snapshots_in_the_sessions_partitions():
    assert spark_conf(LOCAL, engine="delta-spark")["spark.databricks.delta.snapshotPartitions"] == "3"
    assert "spark.databricks.delta.snapshotPartitions" not in spark_conf(LOCAL)


def test_the_driver_maps_a_prepared_class_archive(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv(archive.ARCHIVE_DIR_ENV, str(tmp_path))
    path = archive.archive_path()
    if path is None:
        pytest.skip("no java on this machine")
    assert "SharedArchiveFile" not in spark_conf(LOCAL)["spark.driver.extraJavaOptions"]
    path.write_bytes(b"archive")
    assert f"-XX:SharedArchiveFile={path}" in spark_conf(LOCAL)["spark.driver.extraJavaOptions"]
    dumped = spark_conf(LOCAL, class_archive_out=tmp_path / "out.jsa")["spark.driver.extraJavaOptions"]
    assert f"-XX:ArchiveClassesAtExit={tmp_path / 'out.jsa'}" in dumped


def test_the_operators_conf_wins():
    settings = SparkSettings(master="local[2]", conf={"spark.sql.adaptive.enabled": "true"})
    assert spark_conf(settings)["spark.sql.adaptive.enabled"] == "true"
