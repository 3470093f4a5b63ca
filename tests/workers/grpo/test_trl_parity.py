"""`group_advantages`, `grpo_loss` and `completion_logprobs` against TRL's GRPOTrainer.

TRL (a dev dependency) is the reference implementation. A real `GRPOTrainer` is built on the
tiny model for each TRL setting; nothing of it is stubbed except, for the loss, its method
`_get_per_token_logps_and_entropies`, replaced on the instance so that `_compute_loss` sees the
same fixed log-probs (a leaf tensor) as `grpo_loss`. The gradient compared is the one with
respect to those log-probs.

Mapping: TRL `loss_type` "grpo" <-> `sequence_mean`, "bnpo" and "dapo" <-> `token_mean`,
"dr_grpo" <-> `constant`; `scale_rewards` "group" <-> `std="sample"`, "none" <-> `std="none"`.
Both divide by (std + 1e-4) (TRL: `advantages / (std_rewards + 1e-4)`, Bessel-corrected std).

The one known difference: TRL 1.16 multiplies its k3 KL term by the importance ratio by
default (`use_bias_correction_kl=True`, DeepSeek-V3.2's unbiased KL gradient). Our loss is the
paper's (design.md step 6), so the parity tests turn it off; `test_trl_bias_corrected_kl_differs`
pins what the difference is (same loss value on-policy, a different KL gradient).
"""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from workers.grpo.advantages import group_advantages
from workers.grpo.logprobs import completion_logprobs
from workers.grpo.loss import grpo_loss

AGGREGATION = {"grpo": "sequence_mean", "bnpo": "token_mean", "dapo": "token_mean"}
AGGREGATION["dr_grpo"] = "constant"
STD = {"group": "sample", "none": "none"}
GROUP, N, T, BETA = 4, 12, 6, 0.04
# Three groups of four; the third group has equal rewards (zero std: advantages 0).
REWARDS = [0.1, 0.5, 0.55, 0.9, 0.0, 0.0, 0.3, 1.0, 0.7, 0.7, 0.7, 0.7]
LENGTHS = [6, 3, 1, 6, 5, 2, 6, 4, 6, 6, 2, 3]  # completion tokens per row, EOS included


def _trainer(model_dir, tmp_path, **config) -> GRPOTrainer:
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=N,
        num_generations=GROUP,
        max_completion_length=T,
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        save_strategy="no",
        **config,
    )
    rewards = list(REWARDS)

    def fixed_reward(completions, **_):
        return rewards[: len(completions)]

    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=fixed_reward,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": "Digit 3:"}, {"prompt": "Digit 7:"}] * 6),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; one window here
    return trainer


def _batch(off_policy: bool) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    logp = -torch.rand(N, T, generator=gen) * 3  # (N, T)
    old = logp + 0.4 * torch.randn(N, T, generator=gen) if off_policy else None  # (N, T)
    ref = logp + 0.3 * torch.randn(N, T, generator=gen)  # (N, T)
    mask = (torch.arange(T) < torch.tensor(LENGTHS).unsqueeze(1)).float()  # (N, T)
    adv = group_advantages(torch.tensor(REWARDS), GROUP, "sample")  # (N,)
    return {"logp": logp, "old": old, "ref": ref, "mask": mask, "adv": adv}


def _trl_loss(trainer: GRPOTrainer, b: dict) -> tuple[torch.Tensor, torch.Tensor, dict]:
    logp = b["logp"].clone().requires_grad_()
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.ones_like(logp), None)
    trainer._metrics["train"].clear()
    inputs = {
        "prompt_ids": torch.ones(N, 2, dtype=torch.long),
        "prompt_mask": torch.ones(N, 2, dtype=torch.long),
        "completion_ids": torch.ones(N, T, dtype=torch.long),
        "completion_mask": b["mask"].long(),
        "advantages": b["adv"],
        "ref_per_token_logps": b["ref"],
        "num_items_in_batch": b["mask"].sum(),
    }
    if b["old"] is not None:
        inputs["old_per_token_logps"] = b["old"]
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), logp.grad, {k: v[-1] for k, v in trainer._metrics["train"].items()}


def _our_loss(
    b: dict, aggregation: str, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    logp = b["logp"].clone().requires_grad_()
    loss, stats = grpo_loss(
        logp,
        b["old"],
        b["ref"],
        b["adv"],
        b["mask"],
        clip_epsilon=0.2,
        clip_epsilon_high=eps_high,
        beta=BETA,
        aggregation=aggregation,
        max_new_tokens=T,
    )
    loss.backward()
    return loss.detach(), logp.grad, stats


@pytest.fixture(scope="module")
def trainers(tiny_model, tmp_path_factory):
    cache: dict[tuple, GRPOTrainer] = {}

    def get(**config) -> GRPOTrainer:
        key = tuple(sorted(config.items()))
        if key not in cache:
            cache[key] = _trainer(tiny_model, tmp_path_factory.mktemp("trl"), **config)
        return cache[key]

    return get


@pytest.mark.parametrize("eps_high", [0.2, 0.28])
@pytest.mark.parametrize("off_policy", [False, True], ids=["on_policy", "off_policy"])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
def test_loss_and_gradient_match_trl(trainers, loss_type, off_policy, eps_high) -> None:
    trainer = trainers(
        loss_type=loss_type, beta=BETA, epsilon_high=eps_high, use_bias_correction_kl=False
    )
    b = _batch(off_policy)
    trl_loss, trl_grad, trl_stats = _trl_loss(trainer, b)
    loss, grad, stats = _our_loss(b, AGGREGATION[loss_type], eps_high)

    assert torch.allclose(loss, trl_loss, atol=1e-5, rtol=0), (loss, trl_loss)
    assert torch.allclose(grad, trl_grad, atol=1e-5, rtol=0)
    assert grad.abs().sum() > 0
    assert stats["kl"] == pytest.approx(trl_stats["kl"], abs=1e-5)
    assert stats["clip_ratio_low"] == pytest.approx(trl_stats["clip_ratio/low_mean"], abs=1e-6)
    assert stats["clip_ratio_high"] == pytest.approx(trl_stats["clip_ratio/high_mean"], abs=1e-6)
    assert stats["clip_ratio"] == pytest.approx(trl_stats["clip_ratio/region_mean"], abs=1e-6)
    if off_policy:  # the fixed batch really exercises both clipping sides
        assert stats["clip_ratio_low"] > 0 and stats["clip_ratio_high"] > 0


def test_trl_bias_corrected_kl_differs(trainers) -> None:
    """TRL's default KL (times the ratio): equal loss on-policy, a different gradient."""
    trainer = trainers(loss_type="dapo", beta=BETA, use_bias_correction_kl=True)
    b = _batch(off_policy=False)
    trl_loss, trl_grad, _ = _trl_loss(trainer, b)
    loss, grad, _ = _our_loss(b, "token_mean", 0.2)
    assert torch.allclose(loss, trl_loss, atol=1e-5, rtol=0)
    # d/dlogp of kl * exp(logp - old) adds kl (the ratio is 1, its derivative too) per token.
    kl = torch.exp(b["ref"] - b["logp"]) - (b["ref"] - b["logp"]) - 1  # (N, T)
    extra = BETA * kl * b["mask"] / b["mask"].sum()  # (N, T)
    assert torch.allclose(grad + extra, trl_grad, atol=1e-5, rtol=0)
    assert not torch.allclose(grad, trl_grad, atol=1e-5, rtol=0)


@pytest.mark.parametrize("scale_rewards", ["group", "none"])
def test_advantages_match_trl(trainers, scale_rewards) -> None:
    """TRL's own path: generate, call the (fixed) reward function, normalise per group."""
    trainer = trainers(scale_rewards=scale_rewards, beta=0.0)
    inputs = [{"prompt": p} for p in ("Digit 1:", "Digit 2:", "Digit 3:") for _ in range(GROUP)]
    trl_adv = trainer._generate_and_score_completions(inputs)["advantages"]
    ours = group_advantages(torch.tensor(REWARDS), GROUP, STD[scale_rewards])
    assert torch.allclose(ours, trl_adv, atol=1e-5, rtol=0), (ours, trl_adv)
    assert ours[8:].abs().max() == 0  # the equal-reward group carries no signal


def test_logprobs_match_trl(trainers, tiny_model) -> None:
    """Our log-probs of sampled tokens equal TRL's (fused LM head) on the same model."""
    trainer = trainers(loss_type="dapo", beta=0.0)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = trainer.model.eval()
    prompt = tok(["Digit 3:"] * 4, return_tensors="pt")["input_ids"]  # (4, P)
    completion = torch.randint(4, len(tok), (4, T), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(4, T)  # (4, T)
    with torch.no_grad():
        ours, _ = completion_logprobs(model, prompt, torch.ones_like(prompt), completion, mask)
        ids = torch.cat([prompt, completion], 1)  # (4, P + T)
        theirs, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
            trainer, model, ids, torch.ones_like(ids), T
        )
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=0)
