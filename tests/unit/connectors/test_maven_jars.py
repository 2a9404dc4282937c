"""The JVM component cache: where components live, what a changed version does, what a miss says."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET

import pytest

from connectors import maven_jars
from connectors.maven_jars import COMPONENTS, JarsUnavailable, component_dir, lib_jars


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(maven_jars.CACHE_ENV, str(tmp_path))
    return tmp_path


def test_components_live_in_the_configured_cache_by_name_version_and_artifact_list(cache, monkeypatch):
    where = component_dir("kafka")
    assert where.parent == cache and where.name.startswith(f"kafka-{maven_jars.KAFKA_VERSION}-")
    other = dataclasses.replace(COMPONENTS["kafka"], dependencies=("org.apache.kafka:kafka_2.13:9.9.9",))
    monkeypatch.setitem(COMPONENTS, "kafka", other)
    assert component_dir("kafka") != where, "another artifact list resolves into a directory of its own"


def test_the_default_cache_is_outside_any_clone(monkeypatch):
    monkeypatch.delenv(maven_jars.CACHE_ENV, raising=False)
    assert str(maven_jars.cache_root()).endswith(".cache/cdc-lakehouse/jars")


def test_a_component_not_resolved_names_the_command_that_resolves_it(cache):
    with pytest.raises(JarsUnavailable, match=r"python -m connectors.maven_jars resolve delta"):
        lib_jars("delta")


def test_only_a_complete_resolve_counts(cache):
    lib = component_dir("kafka") / "lib"
    lib.mkdir(parents=True)
    (lib / "kafka-clients-4.4.0.jar").write_bytes(b"")
    assert not maven_jars.is_resolved("kafka")
    (component_dir("kafka") / maven_jars._COMPLETE).write_text("{}")
    assert [jar.name for jar in lib_jars("kafka")] == ["kafka-clients-4.4.0.jar"]


def test_the_pom_lists_every_dependency_with_its_exclusions():
    pom = ET.fromstring(maven_jars._pom(COMPONENTS["delta"]))
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    (dependency,) = pom.findall("m:dependencies/m:dependency", ns)
    assert dependency.findtext("m:artifactId", namespaces=ns) == "delta-spark_2.13"
    assert dependency.findtext("m:version", namespaces=ns) == maven_jars.DELTA_VERSION
    excluded = {e.findtext("m:groupId", namespaces=ns) for e in dependency.findall("m:exclusions/m:exclusion", ns)}
    assert excluded == {"org.apache.spark", "org.scala-lang"}


def test_the_delta_jars_match_the_installed_python_package():
    from importlib.metadata import version

    assert version("delta_spark") == maven_jars.DELTA_VERSION
