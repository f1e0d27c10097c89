"""The deployment as shipped (no database, no cluster): the image's Dockerfile, the compose file and
the Kubernetes manifests, checked against what each runtime requires (the Kubernetes API's own
schemas, through kubernetes-validate; KEDA's resources against the fields of its CRDs)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = "1.31"  # the API version the manifests are checked against

# The parts of KEDA's CRDs (keda.sh/v1alpha1) the manifests use, with the types the CRDs declare.
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
KEDA: dict[str, dict[str, Any]] = {
    "ScaledObject": {
        "type": "object",
        "required": ["scaleTargetRef", "triggers"],
        "additionalProperties": False,
        "properties": {
            "scaleTargetRef": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
            **{k: {"type": "integer", "minimum": 0} for k in ("minReplicaCount", "maxReplicaCount")},
            **{k: {"type": "integer", "minimum": 1} for k in ("pollingInterval", "cooldownPeriod")},
            "triggers": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["type", "metadata"],
                    "additionalProperties": False,
                    "properties": {
                        "type": {"type": "string"},
                        "metadata": _STRINGS,
                        "authenticationRef": {"type": "object", "required": ["name"]},
                    },
                },
            },
        },
    },
    "TriggerAuthentication": {
        "type": "object",
        "properties": {
            "secretTargetRef": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["parameter", "name", "key"],
                    "properties": {k: {"type": "string"} for k in ("parameter", "name", "key")},
                    "additionalProperties": False,
                },
            }
        },
    },
}


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_the_kubernetes_manifests_are_valid_for_the_api() -> None:
    kinds = []
    for doc in documents(ROOT / "deploy/kubernetes/feedproc.yaml"):
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)  # raises on anything invalid
        kinds.append(doc["kind"])
    assert sorted(kinds) == ["Deployment", "Deployment", "Job", "Service"]


def test_the_watchers_probes_are_the_ones_feedproc_watch_serves() -> None:
    (watcher,) = [
        d for d in documents(ROOT / "deploy/kubernetes/feedproc.yaml") if d["metadata"]["name"] == "feedproc-watcher"
    ]
    container = watcher["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert "--health-port" in container["args"] and "0.0.0.0" in container["args"]


def test_the_keda_resources_follow_their_crds_and_scale_the_watchers() -> None:
    docs = documents(ROOT / "deploy/kubernetes/keda-scaledobject.yaml")
    for doc in docs:
        assert doc["apiVersion"] == "keda.sh/v1alpha1"
        jsonschema.validate(doc["spec"], KEDA[doc["kind"]])
    scaled = next(d for d in docs if d["kind"] == "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "feedproc-watcher"
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]
    assert "feedproc_items" in query and "i.gate = p.gate" in query  # the backlog watchers can dispatch now


def test_the_compose_file_runs_postgres_migrate_two_watchers_serve_and_the_handler() -> None:
    compose = yaml.safe_load((ROOT / "deploy/docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "migrate", "handler", "watcher", "serve"}
    assert services["watcher"]["deploy"]["replicas"] == 2
    assert services["watcher"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["serve"]["ports"] == ["8000:8000"]


@pytest.mark.skipif(shutil.which("docker") is None, reason="docker is not installed here")
def test_docker_compose_accepts_the_compose_file() -> None:
    version = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, check=False)
    if version.returncode != 0:
        pytest.skip("this docker has no compose plugin")
    checked = subprocess.run(
        ["docker", "compose", "-f", str(ROOT / "deploy/docker-compose.yml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr


def test_the_image_serves_probes_and_holds_no_database() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "EXPOSE 8000 9090" in dockerfile
    assert "HEALTHCHECK" in dockerfile
    assert '"feedproc[postgres,server]"' in dockerfile  # serve is in the image
    settings = [line for line in dockerfile.splitlines() if not line.lstrip().startswith("#")]
    assert not any("FEEDPROC_DATABASE_URL=" in line for line in settings)  # no database baked in
    assert any("FEEDPROC_REQUIRE_DATABASE_URL=1" in line for line in settings)  # and none assumed
