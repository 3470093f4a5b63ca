"""Fine-tuning from a tenant's own checkpoint, through a real worker: a full checkpoint and a
LoRA adapter (merged into its job's base) are the new job's starting weights."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import httpx
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


def test_a_job_fine_tunes_from_the_tenants_full_checkpoint(
    embedded_service: RunningService, tiny_model_dir: Path, tmp_path: Path
) -> None:
    client = embedded_service.client(embedded_service.new_key(f"full-{tmp_path.name}"))
    grpo = {"steps": 2, "prompts_per_step": 2, "group_size": 4, "learning_rate": 1e-2}
    parent = submit_digit_job(client, TINY, grpo=grpo, checkpoint_every=2)
    assert wait_final(client, parent["id"])["status"] == "succeeded"
    (ckpt,) = client.get(f"/v1/jobs/{parent['id']}/checkpoints").json()["data"]
    trained = _weights(_download(client, parent["id"], tmp_path / "parent"))
    child = _child(client, parent, ckpt["id"])
    _assert_same(_weights(_download(client, child["id"], tmp_path / "child")), trained)
    base = _weights(tiny_model_dir)
    assert max((trained[k] - base[k]).abs().max().item() for k in base) > 1e-3  # it moved


def test_a_job_fine_tunes_from_the_tenants_lora_adapter(
    embedded_service: RunningService, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    client = embedded_service.client(embedded_service.new_key(f"lora-{tmp_path.name}"))
    grpo = {"steps": 2, "prompts_per_step": 2, "group_size": 4, "learning_rate": 5e-2}
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    parent = submit_digit_job(client, TINY, grpo=grpo, lora=lora, checkpoint_every=2)
    assert wait_final(client, parent["id"])["status"] == "succeeded"
    (ckpt,) = client.get(f"/v1/jobs/{parent['id']}/checkpoints").json()["data"]
    assert ckpt["format"] == "peft-adapter"
    adapter = _download(client, parent["id"], tmp_path / "adapter")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    merged = PeftModel.from_pretrained(base, adapter).merge_and_unload().state_dict()
    child = _child(client, parent, ckpt["id"])  # full training on the merged weights
    _assert_same(_weights(_download(client, child["id"], tmp_path / "child")), merged)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert (merged[q] - _weights(tiny_model_dir)[q]).abs().max().item() > 1e-4  # it moved
