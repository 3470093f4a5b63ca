"""Fine-tuning from a tenant's own checkpoint, through a real worker: a full checkpoint and a
LoRA adapter (merged into its job's base) are the new job's starting weights."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from tests.e2e.services import TINY, RunningService
from tests.e2e.test_training_flow import submit_digit_job, wait_final

# Adam moves each weight by about the learning rate a step: at 1e-9 the child's weights are
# its starting weights to well within the tolerance below.
FROZEN = {"learning_rate": 1e-9, "steps": 1, "prompts_per_step": 2, "group_size": 4}


def _download(client: httpx.Client, job_id: str, into: Path) -> Path:
    r = client.get(f"/v1/jobs/{job_id}/checkpoints/latest/download")
    assert r.status_code == 200, r.text
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
        tar.extractall(into, filter="data")
    return into


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).state_dict()


def _child(client: httpx.Client, parent: dict[str, Any], base: str) -> dict[str, Any]:
    spec = {
        "base_model": base, "dataset": parent["spec"]["dataset"],
        "verifiers": [{"name": "digits"}], "grpo": FROZEN,
        "generation": {"max_new_tokens": 4}, "checkpoint_every": 1,
    }  # fmt: skip
    r = client.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    child = r.json()
    assert child["parent_checkpoint"] == base
    final = wait_final(client, child["id"])
    assert final["status"] == "succeeded", final["error"]
    return final


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-6), name


@dataclass
class FromAdapter:
    """A LoRA job, its adapter merged into the base, and the job fine-tuned from the adapter."""

    client: httpx.Client
    checkpoint: dict[str, Any]
    merged: dict[str, torch.Tensor]
    child: dict[str, Any]
    downloads: Path


@pytest.fixture(scope="module")
def from_adapter(
    embedded_service: RunningService, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FromAdapter]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    tmp_path = tmp_path_factory.mktemp("lineage")
    client = embedded_service.client(embedded_service.new_key(f"lora-{tmp_path.name}"))
    grpo = {"steps": 2, "prompts_per_step": 2, "group_size": 4, "learning_rate": 5e-2}
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    parent = submit_digit_job(client, TINY, grpo=grpo, lora=lora, checkpoint_every=2)
    assert wait_final(client, parent["id"])["status"] == "succeeded"
    (ckpt,) = client.get(f"/v1/jobs/{parent['id']}/checkpoints").json()["data"]
    adapter = _download(client, parent["id"], tmp_path / "adapter")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    merged = PeftModel.from_pretrained(base, adapter).merge_and_unload().state_dict()
    child = _child(client, parent, ckpt["id"])  # full training on the merged weights
    try:
        yield FromAdapter(client, ckpt, merged, child, tmp_path)
    finally:
        client.close()


def test_a_job_fine_tunes_from_the_tenants_lora_adapter(
    from_adapter: FromAdapter, tiny_model_dir: Path
) -> None:
    client, merged = from_adapter.client, from_adapter.merged
    assert from_adapter.checkpoint["format"] == "peft-adapter"
    child = from_adapter.child
    _assert_same(_weights(_download(client, child["id"], from_adapter.downloads / "child")), merged)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert (merged[q] - _weights(tiny_model_dir)[q]).abs().max().item() > 1e-4  # it moved


def test_a_job_fine_tunes_from_the_tenants_full_checkpoint(
    from_adapter: FromAdapter, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The parent is the job the adapter test fine-tuned: its checkpoint holds full weights
    that moved from the base, as a full job's would (a full checkpoint's lineage is itself
    alone, however its job started), so no job of its own is trained for it."""
    client, parent = from_adapter.client, from_adapter.child
    (ckpt,) = client.get(f"/v1/jobs/{parent['id']}/checkpoints").json()["data"]
    assert ckpt["format"] == "full"
    trained = _weights(_download(client, parent["id"], tmp_path / "parent"))
    child = _child(client, parent, ckpt["id"])
    _assert_same(_weights(_download(client, child["id"], tmp_path / "child")), trained)
    base = _weights(tiny_model_dir)
    moved = max((trained[k] - base[k]).abs().max().item() for k in base)
    print(f"the parent's weights moved from the base by up to {moved:.2e}")
    assert moved > 1e-3  # it moved
