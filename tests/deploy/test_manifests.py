"""docker-compose.yml and k8s/ agree with the code: they parse, every GRPO_ variable they set
is a field of service.settings.Settings, production settings are all present, and the
Kubernetes manifests validate against the Kubernetes schemas."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
SETTINGS_ENV = {f"GRPO_{name.upper()}" for name in Settings.model_fields}
PRODUCTION = {"GRPO_DATABASE_URL", "GRPO_BROKER_URL", "GRPO_STORAGE_URL"}
K8S_VERSION = "1.30"


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # ["KEY=value", ...]
        env = dict(item.partition("=")[::2] for item in env)
    return {str(k): str(v) for k, v in env.items()}


def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, doc)
        for path in sorted(K8S.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def test_compose_sets_only_known_settings_and_all_production_ones() -> None:
    services = compose()["services"]
    for name in ("api", "worker", "worker-cpu", "worker-2gpu", "migrate"):
        env = environment(services[name])
        grpo = {k for k in env if k.startswith("GRPO_")}
        assert grpo <= SETTINGS_ENV, (name, grpo - SETTINGS_ENV)
        assert grpo >= PRODUCTION, (name, PRODUCTION - grpo)
        Settings.model_validate({k.removeprefix("GRPO_").lower(): env[k] for k in grpo})
    for name in ("postgres", "redis", "minio", "api"):
        assert "test" in services[name]["healthcheck"], name


def test_docker_compose_config_accepts_the_file() -> None:
    tool = shutil.which("docker-compose")
    assert tool, "docker-compose missing: run .ci/ensure-services.sh"
    for args in ([], ["--profile", "cpu"], ["--profile", "multi-gpu"]):
        out = subprocess.run(
            [tool, "-f", str(ROOT / "docker-compose.yml"), *args, "config", "-q"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr


def test_k8s_env_is_known_settings_and_references_resolve() -> None:
    docs = k8s_docs()
    names = {(d["kind"], d["metadata"]["name"]) for _, d in docs if "metadata" in d}
    env_keys: set[str] = set()
    for _, doc in docs:
        if doc["kind"] in ("ConfigMap", "Secret"):
            env_keys |= set(doc.get("data") or {}) | set(doc.get("stringData") or {})
    for file, doc in docs:
        pod = (doc.get("spec") or {}).get("template", {}).get("spec")
        for container in (pod or {}).get("containers", []):
            env_keys |= {e["name"] for e in container.get("env", [])}
            for source in container.get("envFrom", []):
                ref = source.get("configMapRef") or source.get("secretRef")
                kind = "ConfigMap" if "configMapRef" in source else "Secret"
                assert (kind, ref["name"]) in names, (file, ref)
    grpo = {k for k in env_keys if k.startswith("GRPO_")}
    assert grpo <= SETTINGS_ENV, grpo - SETTINGS_ENV
    assert grpo >= PRODUCTION, PRODUCTION - grpo


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed <= on_disk, listed - on_disk
    unlisted = {p for p in on_disk if "keda" in p or p.endswith(".example.yaml")}
    assert on_disk - listed <= unlisted, on_disk - listed


def test_apply_never_overwrites_the_real_secret() -> None:
    """The Secret is the operator's (secret.example.yaml shows it): no listed manifest, and
    no generator, makes one, so `kubectl apply -k k8s/` leaves real credentials alone."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert "secretGenerator" not in kustomization
    for name in kustomization["resources"]:
        kinds = {d["kind"] for d in yaml.safe_load_all((K8S / name).read_text()) if d}
        assert "Secret" not in kinds, name
    example = yaml.safe_load((K8S / "secret.example.yaml").read_text())
    assert example["kind"] == "Secret" and example["metadata"]["name"] == "grpo-secrets"


def test_k8s_manifests_validate_against_the_kubernetes_schemas() -> None:
    import kubernetes_validate

    docs = [(f, d) for f, d in k8s_docs() if d.get("kind") != "Kustomization"]
    kubectl = shutil.which("kubectl")
    if kubectl:  # also the rendered output (namespace, labels, images applied)
        out = subprocess.run(
            [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        docs += [("kustomize", d) for d in yaml.safe_load_all(out.stdout) if d]
    crds = {"keda.sh/v1alpha1"}
    for file, doc in docs:
        if doc.get("apiVersion") in crds:
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{file} {doc['kind']}/{doc['metadata']['name']}: {exc.message}")


def test_worker_gets_a_gpu_and_time_to_checkpoint() -> None:
    worker = next(
        d for _, d in k8s_docs() if d["kind"] == "Deployment" and "worker" in d["metadata"]["name"]
    )
    pod = worker["spec"]["template"]["spec"]
    assert pod.get("terminationGracePeriodSeconds", 30) >= 300
    limits = pod["containers"][0]["resources"]["limits"]
    assert int(limits["nvidia.com/gpu"]) == 1


def test_worker_has_probes_a_metrics_port_and_a_persistent_model_cache() -> None:
    docs = k8s_docs()
    worker = next(
        d for _, d in docs if d["kind"] == "Deployment" and "worker" in d["metadata"]["name"]
    )
    pod = worker["spec"]["template"]["spec"]
    [container] = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    command = container["command"]
    assert str(ports["metrics"]) == command[command.index("--metrics-port") + 1]
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == "metrics", probe
    volumes = {v["name"]: v for v in pod["volumes"]}
    cache = next(m for m in container["volumeMounts"] if m["mountPath"] == "/var/lib/grpo/hf")
    claim = volumes[cache["name"]]["persistentVolumeClaim"]["claimName"]  # not an emptyDir
    assert ("PersistentVolumeClaim", claim) in {
        (d["kind"], d["metadata"]["name"]) for _, d in docs if "metadata" in d
    }
