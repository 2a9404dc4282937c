"""A local checkpoint is written through Spark's FileSystem-based manager (`spark_session.CHECKPOINT_FILE_MANAGER`),
which starts no `chmod` or `readlink` process per file: the session's Hadoop configuration makes Spark's own factory
choose it (the query logs and the state stores take their manager from there), and a stateful query on it commits,
stops and resumes from its checkpoint."""

from __future__ import annotations

from service.runtime.spark_session import FILE_SYSTEM_MANAGER


def test_spark_chooses_the_file_system_manager_for_a_local_checkpoint(spark, tmp_path):
    jvm = spark._jvm
    managers = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
    hadoop_conf = spark._jsparkSession.sessionState().newHadoopConf()
    chosen = managers.create(jvm.org.apache.hadoop.fs.Path(str(tmp_path)), hadoop_conf)
    assert chosen.getClass().getName() == FILE_SYSTEM_MANAGER


def test_a_stateful_query_commits_and_resumes_on_it(spark, tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    checkpoint = tmp_path / "checkpoint"

    def run_once(part: int) -> dict[int, int]:
        (source / f"part-{part}.json").write_text("".join(f'{{"k": {i % 3}}}\n' for i in range(6)))
        counts = (spark.readStream.schema("k INT").json(str(source)).groupBy("k").count())
        rows: dict[int, int] = {}

        def keep(batch, batch_id):
            rows.update({row["k"]: row["count"] for row in batch.collect()})

        query = (counts.writeStream.outputMode("update").foreachBatch(keep)
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        query.awaitTermination(300)
        assert query.exception() is None
        return rows

    assert run_once(0) == {0: 2, 1: 2, 2: 2}
    assert run_once(1) == {0: 4, 1: 4, 2: 4}  # the counts resumed from the state store's checkpoint
    assert sorted(p.name for p in (checkpoint / "commits").iterdir() if not p.name.startswith(".")) == ["0", "1"]
    changelogs = [p for p in (checkpoint / "state").rglob("*.changelog")]
    assert changelogs, "the RocksDB state store wrote no changelog"
    assert not [p for p in checkpoint.rglob("*.tmp")], "a temporary file was left behind"
