"""The GRPO loss against numbers worked out by hand, and gradient accumulation."""

import math

import pytest
import torch

from workers.grpo.loss import grpo_loss, loss_denominator
from workers.losses.terms import LOSSES

# Two completions, three token slots; completion 0 has 2 tokens, completion 1 has 3.
LOGP = [[-1.0, -2.0, -0.5], [-1.5, -0.2, -3.0]]
OLD = [[-1.3, -1.8, -0.5], [-1.0, -0.2, -3.2]]
REF = [[-1.2, -2.0, 0.0], [-1.0, -0.7, -3.0]]
ADV = [1.0, -0.5]
MASK = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
EPS, EPS_HIGH, BETA = 0.2, 0.28, 0.1

# Per-token losses by hand. Ratios rho = exp(logp - old):
#   row 0 (A = +1):   e^0.3 = 1.3499 > 1.28 -> clipped high: -1.28
#                     e^-0.2 = 0.8187 in [0.8, 1.28]: -0.8187        (slot 2 masked)
#   row 1 (A = -0.5): e^-0.5 = 0.6065 < 0.8 -> clipped low: -min(-0.3033, -0.4) = 0.4
#                     1.0: 0.5;  e^0.2 = 1.2214: 0.6107
# k3 KL, d = ref - logp:  row 0: d=-0.2 -> e^-0.2 + 0.2 - 1 = 0.018731, d=0 -> 0
#                         row 1: d=0.5 -> 0.148721, d=-0.5 -> 0.106531, d=0 -> 0
POLICY = [[-1.28, -0.8187308, None], [0.4, 0.5, 0.6107014]]
KL = [[0.0187308, 0.0, None], [0.1487213, 0.1065307, 0.0]]
TOKENS = [
    [p + BETA * k for p, k in zip(pr, kr, strict=True) if p is not None]
    for pr, kr in zip(POLICY, KL, strict=True)
]
# sequence_mean: ((-1.2781269 - 0.8187308) / 2 + (0.4148721 + 0.5106531 + 0.6107014) / 3) / 2
EXPECTED = {"sequence_mean": -0.2681767, "token_mean": -0.1121262, "constant": -0.0700789}


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def _loss(aggregation: str, **overrides):
    kwargs = dict(
        logprobs=_t(LOGP).requires_grad_(),
        old_logprobs=_t(OLD),
        ref_logprobs=_t(REF),
        advantages=torch.tensor(ADV, dtype=torch.float64),
        mask=_t(MASK),
        clip_epsilon=EPS,
        clip_epsilon_high=EPS_HIGH,
        beta=BETA,
        aggregation=aggregation,
        max_new_tokens=4,
    )
    return grpo_loss(**(kwargs | overrides))


def test_hand_numbers_are_consistent() -> None:
    per_seq = [sum(r) / len(r) for r in TOKENS]
    assert sum(per_seq) / 2 == pytest.approx(EXPECTED["sequence_mean"], abs=1e-6)
    assert sum(map(sum, TOKENS)) / 5 == pytest.approx(EXPECTED["token_mean"], abs=1e-6)
    assert sum(map(sum, TOKENS)) / (2 * 4) == pytest.approx(EXPECTED["constant"], abs=1e-6)
    assert math.exp(0.3) > 1 + EPS_HIGH and math.exp(-0.5) < 1 - EPS


@pytest.mark.parametrize("aggregation", ["sequence_mean", "token_mean", "constant"])
def test_loss_matches_hand_computation(aggregation: str) -> None:
    loss, stats = _loss(aggregation)
    assert loss.item() == pytest.approx(EXPECTED[aggregation], abs=1e-6)
    assert stats["loss"] == pytest.approx(EXPECTED[aggregation], abs=1e-6)
    assert stats["kl"] == pytest.approx((0.0187308 + 0.1487213 + 0.1065307) / 5, abs=1e-6)
    assert stats["clip_ratio_low"] == pytest.approx(1 / 5)
    assert stats["clip_ratio_high"] == pytest.approx(1 / 5)
    assert stats["clip_ratio"] == pytest.approx(2 / 5)


def test_policy_loss_excludes_kl() -> None:
    _, stats = _loss("token_mean")
    policy = (-1.28 - 0.8187308 + 0.4 + 0.5 + 0.6107014) / 5
    assert stats["policy_loss"] == pytest.approx(policy, abs=1e-6)
    loss, stats = _loss("token_mean", beta=0.0)
    assert loss.item() == pytest.approx(policy, abs=1e-6)
    assert stats["kl"] == pytest.approx(0.0547965, abs=1e-6)  # measured whenever ref is given


def test_policy_term_is_the_registered_ppo_loss() -> None:
    """Without KL, summed over tokens (`constant`, one token slot per completion, N = 1): GRPO's
    loss of a completion is Tinker's ppo with thresholds 1 - eps and 1 + eps_high."""
    clip = {"clip_low_threshold": 1 - EPS, "clip_high_threshold": 1 + EPS_HIGH}
    for row in range(2):
        lp, old = _t(LOGP)[row], _t(OLD)[row]  # (T,)
        inputs = {"logprobs": old, "advantages": torch.full_like(lp, ADV[row])}
        ppo = (LOSSES["ppo"](lp, inputs, clip) * _t(MASK)[row]).sum()
        grpo, _ = _loss("constant", logprobs=lp[None], old_logprobs=old[None], ref_logprobs=None,
                        advantages=torch.tensor(ADV[row:row + 1], dtype=torch.float64),
                        mask=_t(MASK)[row][None], max_new_tokens=1)  # fmt: skip
        assert grpo.item() == pytest.approx(ppo.item(), abs=1e-12)
        assert ppo.item() == pytest.approx(sum(p for p in POLICY[row] if p is not None), abs=1e-6)


def test_clipped_tokens_get_no_policy_gradient() -> None:
    logp = _t(LOGP).requires_grad_()
    loss, _ = _loss("token_mean", logprobs=logp, ref_logprobs=None)
    loss.backward()
    grad = logp.grad
    assert grad[0, 0] == 0 and grad[1, 0] == 0  # clipped high (A > 0) and low (A < 0)
    assert grad[0, 2] == 0  # masked
    # unclipped token: d/dlogp of -rho * A / 5 = -rho * A / 5
    assert grad[0, 1].item() == pytest.approx(-math.exp(-0.2) * 1.0 / 5, abs=1e-9)


def test_on_policy_ratio_is_one_with_policy_gradient() -> None:
    logp = _t(LOGP).requires_grad_()
    loss, stats = _loss("sequence_mean", logprobs=logp, old_logprobs=None, ref_logprobs=None)
    assert loss.item() == pytest.approx(-(1.0 * 2 / 2 + (-0.5) * 3 / 3) / 2 * 1.0, abs=1e-9)
    assert stats["clip_ratio"] == 0.0
    loss.backward()
    assert logp.grad[0, 0].item() == pytest.approx(-1.0 / 2 / 2)  # -A / |y_0| / N


@pytest.mark.parametrize("aggregation", ["sequence_mean", "token_mean", "constant"])
def test_micro_batch_accumulation_equals_full_batch_gradient(aggregation: str) -> None:
    gen = torch.Generator().manual_seed(0)
    n, width = 8, 6
    logp = -torch.rand(n, width, generator=gen, dtype=torch.float64) * 3
    old = logp + 0.3 * torch.randn(n, width, generator=gen, dtype=torch.float64)
    ref = logp + 0.3 * torch.randn(n, width, generator=gen, dtype=torch.float64)
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([1, 6, 3, 2, 6, 5, 4, 1])
    mask = (torch.arange(width) < lengths[:, None]).double()
    common = dict(
        clip_epsilon=0.2,
        clip_epsilon_high=0.3,
        beta=0.05,
        aggregation=aggregation,
        max_new_tokens=8,
    )

    full = logp.clone().requires_grad_()
    full_loss, _ = grpo_loss(full, old, ref, adv, mask, **common)
    full_loss.backward()

    micro = logp.clone().requires_grad_()
    denominator = loss_denominator(mask, aggregation, 8)
    total = 0.0
    for s in (slice(0, 2), slice(2, 4), slice(4, 8)):
        loss, _ = grpo_loss(
            micro[s], old[s], ref[s], adv[s], mask[s], **common, denominator=denominator
        )
        loss.backward()
        total += loss.item()
    assert total == pytest.approx(full_loss.item(), abs=1e-12)
    torch.testing.assert_close(micro.grad, full.grad, rtol=0, atol=1e-12)
