"""`lakehouse.engine: delta-spark` gives the service's Spark session the Delta jars by itself, and
says how to get them when it cannot.

The session's settings come from `service.runtime.spark_session.build_spark`: the jars of the cache when resolved,
else Spark resolves the Maven package at start. The test run's own session is built the same way
(tests/conftest.py); here the CLI runs where neither the cache nor Maven can serve the jars.
"""

from __future__ import annotations

import os
import subprocess

from connectors.delta.delta_spark import DELTA_CATALOG, DELTA_EXTENSION, delta_artifact
from connectors.maven_jars import lib_jars
from service.config.settings import SparkSettings
from service.runtime.spark_session import _with_engine_conf
from tests.support.pipeline_harness import CLI, write_config

PIPELINE = {"name": "p", "topics": ["t"], "table": "t", "primary_key": ["id"]}
# A resolver at a port nothing listens on: Spark's Ivy finds no Maven repository.
IVY_SETTINGS = """<ivysettings>
  <settings defaultResolver="nowhere"/>
  <caches defaultCacheDir="{cache}"/>
  <resolvers><ibiblio name="nowhere" m2compatible="true" root="http://127.0.0.1:9/maven2/"/></resolvers>
</ivysettings>
"""


def test_the_test_session_was_built_with_the_jars_of_the_cache(spark):
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.sql.extensions") == DELTA_EXTENSION
    assert conf.get("spark.sql.catalog.spark_catalog") == DELTA_CATALOG
    assert conf.get("spark.jars").split(",") == [str(jar) for jar in lib_jars("delta")]
    assert conf.get("spark.jars.packages") is None


def test_the_operators_jars_and_extensions_are_kept_next_to_deltas():
    conf = _with_engine_conf({"spark.jars": "/opt/extra.jar", "spark.sql.extensions": "my.Extension",
                              "spark.databricks.delta.snapshotPartitions": "8"}, "delta-spark", 2)
    assert conf["spark.jars"].split(",")[0] == "/opt/extra.jar" and len(conf["spark.jars"].split(",")) > 1
    assert conf["spark.sql.extensions"] == f"my.Extension,{DELTA_EXTENSION}"
    assert conf["spark.databricks.delta.snapshotPartitions"] == "8"
    assert _with_engine_conf({"a": "b"}, "delta-rs", 2) == {"a": "b"}
    assert SparkSettings().conf == {}


def test_without_the_jars_and_without_maven_the_service_stops_naming_the_fix(tmp_path):
    ivy = tmp_path / "ivysettings.xml"
    ivy.write_text(IVY_SETTINGS.format(cache=tmp_path / "ivy-cache"))
    spark = {"master": "local[1]", "conf": {"spark.jars.ivySettings": str(ivy), "spark.jars.ivy": str(tmp_path / "ivy")}}
    config = write_config(tmp_path / "c.yaml", "127.0.0.1:9", tmp_path, [PIPELINE], engine="delta-spark", spark=spark)
    env = {**os.environ, "CDC_LAKEHOUSE_JAR_CACHE": str(tmp_path / "empty-cache")}
    done = subprocess.run([CLI, "run", str(config), "--until-idle"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert f"spark.jars.packages={delta_artifact()}" in last
    assert "python -m connectors.maven_jars resolve delta" in last and str(tmp_path / "empty-cache") in last
