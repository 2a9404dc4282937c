"""deploy/k8s and the image's entrypoint checked for running the driver against a cluster.

Without a Kubernetes cluster or a Docker engine (docs/operations.md, Deploy): the config the ConfigMap holds
loads with the Deployment's environment for `local[2]` and for `k8s://`, every variable it uses
is set by the Deployment, the driver's ports are declared, the service account the pod runs
as may manage executor pods, the kustomization lists every manifest, and the entrypoint hands
service commands to the CLI.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from service.config.settings import load_settings

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
DOWNWARD_API = {"POD_IP": "10.0.0.7", "POD_NAME": "cdc-lakehouse-0", "POD_NAMESPACE": "cdc"}


def manifests(name: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all((K8S / name).read_text()) if doc]


def container() -> dict:
    (deployment,) = manifests("deployment.yaml")
    (main,) = deployment["spec"]["template"]["spec"]["containers"]
    return main


def config_text() -> str:
    (configmap,) = manifests("configmap.yaml")
    return configmap["data"]["config.yaml"]


def deployment_environment() -> dict[str, str]:
    """The container's variables: literal values, downward-API fields with sample values, secrets as 'x'."""
    values = {}
    for variable in container()["env"]:
        source = variable.get("valueFrom", {})
        values[variable["name"]] = variable.get("value") or DOWNWARD_API.get(variable["name"]) or (
            "x" if "secretKeyRef" in source else None)
    assert None not in values.values(), values
    return values


def test_every_config_variable_is_set_by_the_deployment():
    assert set(_VARIABLE.findall(config_text())) <= set(deployment_environment())


@pytest.mark.parametrize("master", [None, "k8s://https://kubernetes.default.svc"])
def test_configmap_loads_for_the_pod_and_for_executor_pods(tmp_path, monkeypatch, master):
    environment = deployment_environment()
    if master:
        environment["SPARK_MASTER"] = master
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "config.yaml").write_text(config_text())
    spark = load_settings(tmp_path / "config.yaml").spark
    assert spark.master == (master or "local[2]")
    assert spark.conf["spark.driver.host"] == DOWNWARD_API["POD_IP"]
    assert spark.conf["spark.kubernetes.container.image"] == environment["SPARK_EXECUTOR_IMAGE"]
    assert spark.conf["spark.kubernetes.driver.pod.name"] == DOWNWARD_API["POD_NAME"]
    ports = {port["containerPort"] for port in container()["ports"]}
    assert {int(spark.conf["spark.driver.port"]), int(spark.conf["spark.blockManager.port"])} <= ports


def test_the_pod_may_manage_its_executor_pods():
    (deployment,) = manifests("deployment.yaml")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    kinds = {doc["kind"]: doc for doc in manifests("rbac.yaml")}
    assert kinds["ServiceAccount"]["metadata"]["name"] == account
    assert kinds["RoleBinding"]["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    assert kinds["RoleBinding"]["roleRef"]["name"] == kinds["Role"]["metadata"]["name"]
    (pods,) = [rule for rule in kinds["Role"]["rules"] if "pods" in rule["resources"]]
    assert {"create", "delete", "watch", "list", "get"} <= set(pods["verbs"])


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in K8S.glob("*.yaml")
                                                        if p.name != "kustomization.yaml")


def test_image_entrypoint_hands_service_commands_to_the_cli(tmp_path):
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["cdc-lakehouse-entrypoint"]' in dockerfile
    assert "/src/deploy/entrypoint.sh /usr/local/bin/cdc-lakehouse-entrypoint" in dockerfile
    assert "!deploy/entrypoint.sh" in (REPO / "deploy" / "Dockerfile.dockerignore").read_text().splitlines()
    (tmp_path / "config.yaml").write_text(config_text())
    environment = {**os.environ, **deployment_environment(), "SPARK_HOME": str(tmp_path),
                   "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    result = subprocess.run(["bash", str(REPO / "deploy" / "entrypoint.sh"), "validate", str(tmp_path / "config.yaml")],
                            capture_output=True, text=True, env=environment, timeout=120)
    assert result.returncode == 0 and "pipeline(s)" in result.stdout, result.stderr
