"""LoRA through peft: pi_ref is the adapter-disabled model, checkpoints are peft adapters, and
`export_merged` writes full weights that equal base + adapter."""

from __future__ import annotations

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from tests.workers.grpo.helpers import Recorder, small_spec
from workers.grpo.logprobs import completion_logprobs
from workers.grpo.policy import load_policy
from workers.grpo.trainer import train


def _ids(n: int = 3, prompt: int = 5, completion: int = 4) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    return (
        torch.randint(3, 90, (n, prompt), generator=gen),
        torch.ones(n, prompt, dtype=torch.long),
        torch.randint(3, 90, (n, completion), generator=gen),
        torch.ones(n, completion),
    )


def test_reference_is_the_adapter_disabled_model(tiny_model):
    spec = small_spec(tiny_model, beta=0.04, spec={"lora": {"r": 4}})
    policy = load_policy(spec, "cpu")
    assert policy.reference is policy.model  # no second copy of the weights
    with torch.no_grad():  # make the adapter do something (B starts at 0)
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    batch = _ids()
    with torch.no_grad():
        expected, _ = completion_logprobs(base, *batch)
        with policy.reference_context():
            ref, _ = completion_logprobs(policy.reference, *batch)
        adapted, _ = completion_logprobs(policy.model, *batch)
    torch.testing.assert_close(ref, expected)
    assert (adapted - expected).abs().max() > 1e-3
    assert all("lora_" in n for n, p in policy.model.named_parameters() if p.requires_grad)


def test_lora_checkpoint_loads_with_peft_and_merged_weights_match(
    tiny_model, digit_records, digit_scorer, tmp_path
):
    spec = small_spec(
        tiny_model, learning_rate=5e-2, beta=0.0,
        spec={"lora": {"r": 4, "target_modules": "all-linear", "export_merged": True}},
    )  # fmt: skip
    result = train(spec, digit_records, [digit_scorer], tmp_path, Recorder())
    ckpt = result.final_checkpoint
    assert (ckpt / "adapter_model.safetensors").exists() and not (
        ckpt / "model.safetensors"
    ).exists()
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    batch = _ids()
    with torch.no_grad():
        base_lp, _ = completion_logprobs(base, *batch)
        adapted = PeftModel.from_pretrained(base, ckpt)
        adapted_lp, _ = completion_logprobs(adapted, *batch)
        merged = AutoModelForCausalLM.from_pretrained(ckpt / "merged")
        merged_lp, _ = completion_logprobs(merged, *batch)
    assert (adapted_lp - base_lp).abs().max() > 1e-4  # the adapter was trained
    torch.testing.assert_close(merged_lp, adapted_lp, atol=1e-5, rtol=1e-5)
    assert (ckpt / "merged" / "tokenizer.json").exists()
    assert not any("lora" in k for k in merged.state_dict())


def test_lora_dropout_trains_through_peft_and_decodes_lean(
    tiny_model, digit_records, digit_scorer, tmp_path
):
    """LoRA dropout is at work only while training: the policy decodes and scores pi_ref
    through the lean path (eval mode: no dropout) and trains through peft's own forward."""
    from workers.grpo.fast import lean

    spec = small_spec(
        tiny_model, steps=2, beta=0.04, spec={"lora": {"r": 4, "dropout": 0.1}}
    )  # fmt: skip
    policy = load_policy(spec, "cpu")
    assert lean.supported(policy.model.eval(), 64)
    assert not lean.supported(policy.model.train(), 64)
    recorder = Recorder()
    train(spec, digit_records, [digit_scorer], tmp_path, recorder)
    step2 = recorder.metrics[2]
    assert step2["kl"] > 0 and all(torch.isfinite(torch.tensor(v)) for v in step2.values())
