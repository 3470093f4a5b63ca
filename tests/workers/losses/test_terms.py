"""The built-in losses against hand-worked values and gradients (d loss / d lp) on three tokens."""

from __future__ import annotations

import math

import pytest
import torch

from workers.losses.registry import CLIENT_SIDE_CUSTOM, REFUSED, SPECS
from workers.losses.terms import LOSSES, ppo, register_loss

LP = [-1.0, -0.5, -2.0]  # the learner's log-probs
Q = [-1.2, -1.5, -1.0]  # the sampler's: ratios exp(0.2), exp(1.0), exp(-1.0)
ADV = [1.0, 2.0, -1.0]


def run(name: str, config: dict | None = None, **extra) -> tuple[list[float], list[float]]:
    """Elementwise loss and its gradient with respect to the learner's log-probs."""
    cfg = {**SPECS[name].config, **(config or {})}
    lp = torch.tensor(LP, dtype=torch.float64, requires_grad=True)
    x = {"logprobs": torch.tensor(Q, dtype=torch.float64),
         "advantages": torch.tensor(ADV, dtype=torch.float64)}  # fmt: skip
    x.update({k: torch.tensor(v, dtype=torch.float64) for k, v in extra.items()})
    out = LOSSES[name](lp, x, cfg)
    out.sum().backward()
    return out.tolist(), lp.grad.tolist()


def test_cross_entropy_is_weighted_negative_logprob() -> None:
    loss, grad = run("cross_entropy", weights=[0.0, 1.0, 2.0])
    assert loss == pytest.approx([0.0, 0.5, 4.0])
    assert grad == pytest.approx([0.0, -1.0, -2.0])


def test_importance_sampling_by_hand() -> None:
    r = [math.exp(0.2), math.exp(1.0), math.exp(-1.0)]
    loss, grad = run("importance_sampling")
    assert loss == pytest.approx([-r[0] * 1.0, -r[1] * 2.0, r[2] * 1.0])
    # d(-r A)/d lp = -r A (r = exp(lp - q))
    assert grad == pytest.approx([-r[0], -2 * r[1], r[2]])


def test_ppo_clips_the_ratio_where_it_pays() -> None:
    r0, r1, r2 = math.exp(0.2), math.exp(1.0), math.exp(-1.0)
    loss, grad = run("ppo")  # thresholds 0.8, 1.2
    # token 0: r = 1.221 > 1.2, A > 0: min picks the clipped 1.2 -> no gradient
    # token 1: r = 2.718, A = 2 > 0: clipped 1.2 * 2 -> no gradient
    # token 2: r = 0.368 < 0.8, A = -1: min(-0.368, -0.8) = -0.8 (clipped) -> no gradient
    assert loss == pytest.approx([-1.2, -2.4, 0.8])
    assert grad == pytest.approx([0.0, 0.0, 0.0])
    loss, grad = run("ppo", {"clip_low_threshold": 0.3, "clip_high_threshold": 3.0})
    assert loss == pytest.approx([-r0, -2 * r1, r2])  # nothing clipped: importance sampling
    assert grad == pytest.approx([-r0, -2 * r1, r2])


def test_ppo_per_token_thresholds_win_over_the_config() -> None:
    r0 = math.exp(0.2)
    loss, _ = run("ppo", clip_low_threshold=[0.1] * 3, clip_high_threshold=[5.0, 1.1, 5.0])
    assert loss[0] == pytest.approx(-r0)
    assert loss[1] == pytest.approx(-1.1 * 2)


def test_cispo_weights_logprob_by_the_detached_clipped_ratio() -> None:
    loss, grad = run("cispo")  # clipped ratios 1.2, 1.2, 0.8
    assert loss == pytest.approx([-1.2 * -1.0 * 1.0, -1.2 * -0.5 * 2.0, -0.8 * -2.0 * -1.0])
    assert grad == pytest.approx([-1.2, -2.4, 0.8])


def test_dro_quadratic_penalty() -> None:
    beta = 0.5
    loss, grad = run("dro", {"beta": beta})
    d = [a - b for a, b in zip(LP, Q, strict=True)]  # 0.2, 1.0, -1.0
    assert loss == pytest.approx([-(lp * a - 0.5 * beta * x * x)
                                  for lp, a, x in zip(LP, ADV, d, strict=True)])  # fmt: skip
    assert grad == pytest.approx([-(a - beta * x) for a, x in zip(ADV, d, strict=True)])


def test_gspo_token_carries_the_sequence_ratio() -> None:
    # s = exp(mean(0.2, 1.0)) = exp(0.6) = 1.822 over tokens 0, 1 (token 2 out of the mask)
    s = math.exp(0.6)
    loss, grad = run("gspo", {"clip_low_threshold": 0.5, "clip_high_threshold": 2.0},
                     sequence_ratio_mask=[1.0, 1.0, 0.0])  # fmt: skip
    assert loss == pytest.approx([-s * 1.0, -s * 2.0, s * 1.0])  # nothing clipped
    # d(-s_t A_t)/d lp_t = -s A_t: each token its own gradient, scaled by the sequence's s
    assert grad == pytest.approx([-s, -2 * s, s])
    loss, grad = run("gspo")  # no mask: s over all three tokens; thresholds 0.8 / 1.2
    s = math.exp((0.2 + 1.0 - 1.0) / 3)  # 1.069: inside [0.8, 1.2]
    assert loss == pytest.approx([-s, -2 * s, s])
    assert grad == pytest.approx([-s, -2 * s, s])
    _, grad = run("gspo", {"clip_high_threshold": 1.05})  # s clipped where A > 0: no gradient
    assert grad == pytest.approx([0.0, 0.0, s])


def test_each_registered_name_has_one_term() -> None:
    assert sorted(LOSSES) == sorted(SPECS)
    with pytest.raises(ValueError, match="twice"):
        register_loss("ppo")(ppo)
    with pytest.raises(KeyError):
        register_loss("nll")(ppo)
    assert not REFUSED.keys() & SPECS.keys()


def test_the_sdks_client_side_custom_loss_gets_its_gradient() -> None:
    """forward_backward_custom: a forward with weights 0 (the SDK's default), then
    CLIENT_SIDE_CUSTOM with weights = -dC/d lp; the backward then carries C's gradient."""
    lp = torch.tensor(LP, dtype=torch.float64, requires_grad=True)
    custom = (lp**2).sum() + lp[0] * lp[2]  # any C(logprobs)
    (grad_c,) = torch.autograd.grad(custom, lp)
    term = LOSSES[CLIENT_SIDE_CUSTOM]
    zero = {"weights": torch.zeros(3, dtype=torch.float64)}
    assert term(lp, zero, {}).tolist() == [0.0, 0.0, 0.0]
    term(lp, {"weights": -grad_c}, {}).sum().backward()
    assert lp.grad.tolist() == pytest.approx(grad_c.tolist())
    # the SDK's _CUSTOM_BACKEND_LOSS_FN_BY_INPUT_TYPE["logprobs"] (tinker 0.38.0)
    assert CLIENT_SIDE_CUSTOM == "cross_entropy" and "weights" in SPECS[CLIENT_SIDE_CUSTOM].inputs
