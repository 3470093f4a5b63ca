"""k8s/overlays/multinode/: a JobSet running one GRPO run across nodes through torchrun's c10d
rendezvous. Validated against the JobSet CRD's own schema (vendored: no network here), with its
embedded Job template against the Kubernetes batch/v1 schema, and its rendezvous checked for
consistency: node count, GPUs per node, endpoint (pod 0's DNS name) and the batch's split."""

from __future__ import annotations

import copy
import json
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.test_manifests import K8S_VERSION
from workers.grpo.config import TrainSpec
from workers.grpo.world import check_world

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "k8s" / "overlays" / "multinode"
JOBSET_SCHEMA = Path(__file__).parent / "schemas" / "jobset-v1alpha2.json"


def _strict(schema: Any) -> Any:
    """The CRD's schema with unknown fields refused: the API server would silently prune them
    (a structural schema), so a misspelt field would be dropped without a word."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


VALIDATOR = jsonschema.Draft7Validator(_strict(json.loads(JOBSET_SCHEMA.read_text())))


def rendered() -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if not kubectl:  # the files as written (the generated ConfigMap then missing)
        docs = [
            d for p in sorted(OVERLAY.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text())
        ]
        return [d for d in docs if d and d.get("kind") != "Kustomization"]
    out = subprocess.run(
        [kubectl, "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def jobset() -> dict[str, Any]:
    return next(d for d in rendered() if d["kind"] == "JobSet")


def jobset_errors(doc: dict[str, Any]) -> list[str]:
    """The JobSet against the CRD's schema, and each replicated Job's template against batch/v1."""
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in VALIDATOR.iter_errors(doc)]
    for rj in doc["spec"]["replicatedJobs"]:
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": rj["name"]},
               "spec": rj["template"]["spec"]}  # fmt: skip
        try:
            kubernetes_validate.validate(job, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"replicatedJobs {rj['name']}: {exc.message}")
    return errors


def test_the_overlay_validates_against_the_jobset_and_kubernetes_schemas() -> None:
    docs = rendered()
    assert {d["kind"] for d in docs} >= {"JobSet", "PersistentVolumeClaim"}
    for doc in docs:
        assert doc["metadata"].get("namespace", "grpo") == "grpo"
        if doc["kind"] == "JobSet":
            assert doc["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
            assert jobset_errors(doc) == []
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    "path, value",
    [
        (("spec", "network", "enableDNSHostname"), True),  # misspelt: pruned by the server
        (("spec", "failurePolicy", "maxRestarts"), "3"),  # wrong type
    ],
)
def test_the_schema_check_catches_a_broken_jobset(path: tuple[str, ...], value: Any) -> None:
    doc = copy.deepcopy(jobset())
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert jobset_errors(doc)


def _torchrun(pod: dict[str, Any]) -> dict[str, str]:
    script = " ".join(pod["containers"][0]["args"])
    words = shlex.split(script[script.index("exec torchrun") :])
    return dict(w[2:].split("=", 1) for w in words if w.startswith("--") and "=" in w)


def test_the_rendezvous_is_consistent() -> None:
    doc = jobset()
    [rj] = doc["spec"]["replicatedJobs"]
    job = rj["template"]["spec"]
    pod = job["template"]["spec"]
    args = _torchrun(pod)
    nodes, per_node = int(args["nnodes"]), int(args["nproc-per-node"])
    assert job["parallelism"] == job["completions"] == nodes and job["completionMode"] == "Indexed"
    container = pod["containers"][0]
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == per_node
    assert args["rdzv-backend"] == "c10d" and args.get("max-restarts") == "0"
    host, port = args["rdzv-endpoint"].rsplit(":", 1)
    subdomain = doc["spec"]["network"]["subdomain"]
    assert host == f"{doc['metadata']['name']}-{rj['name']}-0-0.{subdomain}"  # pod 0's DNS name
    assert doc["spec"]["network"]["enableDNSHostnames"] is True
    assert int(port) in {p["containerPort"] for p in container["ports"]}
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
              if "persistentVolumeClaim" in v}  # fmt: skip
    assert "grpo-multinode-run" in claims  # every rank's checkpoint shards in one folder
    spec = json.loads((OVERLAY / "job.json").read_text())
    train = TrainSpec.model_validate({k: v for k, v in spec.items() if k in TrainSpec.model_fields})
    check_world(train, nodes * per_node)  # the batch splits into whole groups over every rank
