"""The delta-spark engine conforms to the delta-rs engine: same scenarios, same tables.

Every scenario of `delta_engine_scenarios` runs here through `DeltaRsTable` (no JVM jars,
runs everywhere) against written-out expectations; that is the reference. The same
scenarios run through `DeltaSparkTable` in a Spark session of their own, in a subprocess
(the test run's shared session starts before any Delta jars could be configured), wherever
the jars are at hand: listed in CDC_LAKEHOUSE_DELTA_JARS (comma-separated local files),
found on this machine, or resolvable because Maven Central answers. Elsewhere those tests
skip, naming what was missing. Detection itself always runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from importlib.metadata import version
from pathlib import Path

import pyarrow as pa
import pyspark
import pytest

from connectors.delta.delta_rs import DeltaRsTable
from connectors.delta.delta_spark import DeltaSparkTable, DeltaSparkUnavailable, _class_loaded, delta_artifact
from connectors.delta.delta_spark import missing_delta_reason
from connectors.delta.engines import open_table
from tests.integration import delta_engine_scenarios as scenarios

REPO = Path(__file__).resolve().parents[2]
JARS_ENV = "CDC_LAKEHOUSE_DELTA_JARS"
_MAVEN = "https://repo1.maven.org/maven2"
_PROBE_TIMEOUT_S = 3.0
_RUN_TIMEOUT_S = 900  # includes resolving the Delta package from Maven on a first run
EXPECTED = {
    "merge_evolve": {
        "before": [None, None, None],
        "rows": [
            {"te`nant": "t", "id": 1, "name": "a2", "odd col.x": "o1", "email": "a@x"},
            {"te`nant": "t", "id": 3, "name": "c", "odd col.x": None, "email": None},
        ],
        "columns": [*scenarios.DATA.names, "email"],  # control columns never reach the table
        "last_batch": 1,
        "cdf": "true",
    },
    "merge_with_truncate": {
        "rows": [
            {"te`nant": "t", "id": 1, "name": "a3", "odd col.x": "o3"},
            {"te`nant": "t", "id": 5, "name": "e", "odd col.x": None},
        ],
        "one_commit": True,
        "last_batch": 1,
    },
    "truncate": {"rows": [], "last_batch": 1, "missing": None},
    "merge_sink_truncates": {
        "after_merge": [[2, "b2"], [3, "c"]],
        "after_truncate": [],
        "last_batch": 2,
        "outcomes": [[2, 0, False, False], [2, 0, False, True], [0, 0, False, True], [0, 0, True, False]],
    },
}


def test_every_scenario_has_an_expectation():
    assert set(EXPECTED) == set(scenarios.SCENARIOS)


@pytest.mark.parametrize("scenario", sorted(scenarios.SCENARIOS))
def test_delta_rs_reference(scenario, tmp_path):
    assert scenarios.observe(scenario, DeltaRsTable, tmp_path) == EXPECTED[scenario]


# --- detection: always runs ------------------------------------------------------------------


def test_the_engine_opens_only_where_the_delta_classes_load(spark, tmp_path):
    assert _class_loaded(spark, "org.apache.spark.sql.SparkSession")
    assert not _class_loaded(spark, "io.delta.tables.NoSuchClass")
    reason = missing_delta_reason(spark)
    uri = str(tmp_path / "t")
    if reason is None:
        assert isinstance(open_table("delta-spark", uri, None, spark), DeltaSparkTable)
        return
    assert "io.delta.tables.DeltaTable" in reason and delta_artifact() in reason
    with pytest.raises(DeltaSparkUnavailable, match=r"cannot open .*/t with delta-spark: the Delta Lake jars"):
        DeltaSparkTable(spark, uri)
    with pytest.raises(DeltaSparkUnavailable):
        open_table("delta-spark", uri, None, spark)


# --- conformance: needs the Delta jars, in a session of its own ------------------------------


def _jar_names() -> tuple[str, str]:
    delta_version = version("delta_spark")
    major_minor = ".".join(pyspark.__version__.split(".")[:2])
    return f"delta-spark_{major_minor}_2.13-{delta_version}.jar", f"delta-storage-{delta_version}.jar"


def _jar_places() -> list[Path]:
    home = Path.home()
    places = [Path(pyspark.__file__).parent / "jars", home / ".ivy2.5.2" / "jars", home / ".ivy2" / "jars"]
    if os.environ.get("SPARK_HOME"):
        places.append(Path(os.environ["SPARK_HOME"]) / "jars")
    return places


def _local_delta_jars() -> list[str]:
    """The delta-spark and delta-storage jars of the installed version, if on this machine."""
    found: dict[str, str] = {}
    for place in _jar_places():
        for name in _jar_names():
            if name not in found and (place / name).is_file():
                found[name] = str(place / name)
    return list(found.values()) if len(found) == len(_jar_names()) else []


def _maven_answers() -> bool:
    """Whether Maven Central serves the Delta POM within a few seconds (DNS included).

    The request runs on a daemon thread: a resolver that hangs cannot hold the test run."""
    group, artifact, release = delta_artifact().split(":")
    url = f"{_MAVEN}/{group.replace('.', '/')}/{artifact}/{release}/{artifact}-{release}.pom"
    answered = threading.Event()

    def probe() -> None:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=_PROBE_TIMEOUT_S):
                answered.set()
        except Exception:  # noqa: BLE001 - unreachable for any reason means "no"
            pass

    threading.Thread(target=probe, name="maven-probe", daemon=True).start()
    return answered.wait(_PROBE_TIMEOUT_S + 1)


def _jars_to_use() -> tuple[list[str], str]:
    """(local jars, or [] to resolve from Maven; where they come from); skips when neither."""
    listed = [str(Path(j.strip()).resolve()) for j in os.environ.get(JARS_ENV, "").split(",") if j.strip()]
    if listed:
        missing = [j for j in listed if not Path(j).is_file()]
        if missing:
            pytest.fail(f"{JARS_ENV} lists files that do not exist: {', '.join(missing)}")
        return listed, f"{JARS_ENV}={','.join(listed)}"
    found = _local_delta_jars()
    if found:
        return found, f"jars found on this machine: {','.join(found)}"
    if _maven_answers():
        return [], f"spark.jars.packages={delta_artifact()} (Maven Central answered)"
    pytest.skip(
        f"delta-spark conformance cannot run here: {JARS_ENV} is not set, {' and '.join(_jar_names())} are not in "
        f"{', '.join(str(p) for p in _jar_places())}, and Maven Central did not answer a probe for "
        f"{delta_artifact()} (bounded at {_PROBE_TIMEOUT_S:.0f}s)"
    )


@pytest.fixture(scope="module")
def delta_spark_run(tmp_path_factory) -> dict:
    """Every scenario run through DeltaSparkTable in a subprocess with its own Spark session."""
    jars, source = _jars_to_use()
    root = tmp_path_factory.mktemp("delta-spark")
    out = root / "results.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "tests.integration.delta_engine_scenarios", str(root), str(out), ",".join(jars)]
    try:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=_RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the delta-spark scenarios did not finish within {_RUN_TIMEOUT_S}s ({source})")
    if done.returncode != 0 or not out.is_file():
        message = f"the delta-spark scenarios failed to run ({source}):\n{done.stderr[-4000:]}"
        if not jars:  # the Maven path: an environment problem, not an engine one
            pytest.skip(message)
        pytest.fail(message)
    results = json.loads(out.read_text())
    if "unavailable" in results:
        pytest.fail(f"a session started with {source} cannot run delta-spark: {results['unavailable']}")
    return {**results["scenarios"], "root": str(root)}


def _observed(run: dict, scenario: str):
    outcome = run[scenario]
    assert "error" not in outcome, f"{scenario} failed on delta-spark:\n{outcome.get('error')}"
    return outcome["observed"]


@pytest.mark.parametrize("scenario", sorted(scenarios.SCENARIOS))
def test_delta_spark_conforms_to_delta_rs(delta_spark_run, scenario, tmp_path):
    assert _observed(delta_spark_run, scenario) == scenarios.observe(scenario, DeltaRsTable, tmp_path)


def test_delta_spark_change_feed_matches_delta_rs(delta_spark_run, tmp_path):
    scenarios.observe("merge_evolve", DeltaRsTable, tmp_path)
    reference = scenarios.change_feed(str(tmp_path / "t"))
    spark_table = str(Path(delta_spark_run["root"]) / "merge_evolve" / "t")
    observed = _observed(delta_spark_run, "spark_change_feed")
    assert observed["timestamp"] == str(pa.timestamp("us", tz="UTC"))
    assert observed["changes"] == scenarios.change_feed(spark_table) == reference
    assert {"insert", "update_preimage", "update_postimage", "delete"} <= {c for c, _, _ in reference}


def test_delta_spark_skips_a_replayed_batch_by_its_transaction(delta_spark_run):
    assert _observed(delta_spark_run, "spark_replay_skipped") == {"version_unchanged": True, "ids": [1, 2]}
