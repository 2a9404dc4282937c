"""Table maintenance under a pipeline's layout (`table_shape`): a partitioned table is compacted per
partition and z-ordered by the key columns that are not partition columns (both engines); a clustered
table (delta-spark) is clustered by its OPTIMIZE, never z-ordered. Read back with delta-rs and Spark."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from connectors.delta.delta_rs import DELETE_FLAG
from connectors.delta.engines import open_table
from service.config.settings import Settings, settings_from_mapping
from service.operations.maintenance import TableMaintenance

SCHEMA = pa.schema([("region", pa.string()), ("id", pa.int64()), ("n", pa.int64())])


def _settings(workdir: Path, engine: str, shape: dict) -> Settings:
    return settings_from_mapping({
        "lakehouse": {"root": str(workdir / "tables"), "engine": engine},
        "checkpoint_root": str(workdir / "checkpoints"),
        "maintenance": {"every_batches": 1, "every_seconds": None, "z_order": True},
        "pipelines": [{"name": "layout", "topics": ["t"], "table": "t", "primary_key": ["region", "id"],
                       "table_shape": shape}],
    })


def _write(settings: Settings, spark, shape: dict) -> str:
    """Four MERGEs of two regions' rows into a new table laid out as `shape` says: small files."""
    lakehouse = settings.lakehouse
    table = open_table(lakehouse.engine, lakehouse.table_uri("t"), None, spark)
    table.create(SCHEMA, tuple(shape.get("partition_by", ())), tuple(shape.get("cluster_by", ())))
    for batch in range(4):
        ids = [batch * 2, batch * 2 + 1]
        table.merge(pa.table({"region": ["eu", "us"], "id": pa.array(ids, pa.int64()),
                              "n": pa.array([batch, batch], pa.int64()), DELETE_FLAG: [False, False]}),
                    ("region", "id"), "layout-test", batch)
    return table.uri


def _rows(uri: str, spark) -> list[list[dict]]:
    by_rs = DeltaTable(uri).to_pyarrow_table().sort_by("id").to_pylist()
    by_spark = [row.asDict() for row in spark.read.format("delta").load(uri).orderBy("id").collect()]
    return [sorted(by_rs, key=lambda r: r["id"]), by_spark]


@pytest.mark.parametrize("engine", ["delta-rs", "delta-spark"])
def test_a_partitioned_table_is_compacted_per_partition_and_z_ordered_by_the_other_key_columns(
        spark, engine, tmp_path):
    shape = {"partition_by": ["region"]}
    settings = _settings(tmp_path, engine, shape)
    uri = _write(settings, spark, shape)
    before = _rows(uri, spark)
    [compact] = [r for r in TableMaintenance(settings, settings.pipelines[0], spark=spark).run() if r.step == "compact"]
    assert compact.result == "done" and "per partition of region, z-ordered by id" in compact.detail, compact
    files = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).column("path").to_pylist()
    assert sorted(f.split("/")[0] for f in files) == ["region=eu", "region=us"]  # one file per partition
    [optimize] = [c for c in DeltaTable(uri).history() if c["operation"] == "OPTIMIZE"]
    if engine == "delta-spark":
        assert optimize["operationParameters"]["zOrderBy"] == '["id"]'
    assert _rows(uri, spark) == before and len(before[0]) == 8


def test_a_clustered_table_is_clustered_by_its_optimize_not_z_ordered(spark, tmp_path):
    shape = {"cluster_by": ["n"]}
    settings = _settings(tmp_path, "delta-spark", shape)
    uri = _write(settings, spark, shape)
    before = _rows(uri, spark)
    [compact] = [r for r in TableMaintenance(settings, settings.pipelines[0], spark=spark).run() if r.step == "compact"]
    assert compact.result == "done" and "clustered" in compact.detail, compact
    [optimize] = [c for c in DeltaTable(uri).history() if c["operation"] == "OPTIMIZE"]
    assert optimize["operationParameters"].get("clusterBy") == '["n"]', optimize["operationParameters"]
    assert _rows(uri, spark) == before
