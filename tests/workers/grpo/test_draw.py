"""The one draw kernel (`workers.grpo.draw`): per-row settings in one batch draw as each row
alone, greedy below the floor, top-k and top-p as specified, and per-row seeds that make a
batch split across samplers draw as one."""

from __future__ import annotations

import pytest
import torch

from workers.grpo.config import GenerationParams
from workers.grpo.draw import (
    BLOCKED_DRAW_MIN_VOCAB,
    GREEDY_BELOW,
    NoiseStream,
    RowSeeds,
    RowSettings,
    draw,
    filter_logits,
    row_noise,
    seeded_noise,
)
from workers.grpo.sampling import PlainSampler

CPU = torch.device("cpu")
# (temperature, top_k, top_p) per row: sampled, greedy, filtered both ways, top-k past V
MIXED = [(1.0, 0, 1.0), (0.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.6), (0.5, 3, 0.9),
         (1e-6, 4, 0.5), (1.0, 1, 1.0), (2.0, 10**6, 0.95)]  # fmt: skip


def _settings(rows: list[tuple[float, int, float]]) -> RowSettings:
    t, k, p = zip(*rows, strict=True)
    return RowSettings(tuple(t), tuple(k), tuple(p), CPU)


@pytest.mark.parametrize("vocab", [50, BLOCKED_DRAW_MIN_VOCAB + 77])
def test_mixed_rows_draw_as_each_row_alone(vocab: int) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(len(MIXED), vocab, generator=gen) * 3  # (N, V)
    steps = 20 if vocab < BLOCKED_DRAW_MIN_VOCAB else 3
    for step in range(steps):
        noise = seeded_noise([(9, i) for i in range(len(MIXED))], steps, CPU)[:, step]  # (N,)
        tokens, logprobs = draw(logits, _settings(MIXED), noise, keep=True)
        for i, (t, k, p) in enumerate(MIXED):
            alone = RowSettings.uniform(t, k, p, 1, CPU)
            token, logprob = draw(logits[i : i + 1], alone, noise[i : i + 1], keep=True)
            assert int(tokens[i]) == int(token[0])
            assert float(logprobs[i]) == pytest.approx(float(logprob[0]), abs=1e-6)


def test_below_the_floor_is_the_argmax_with_t1_logprobs() -> None:
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(1))  # (N, V)
    for t in (0.0, 1e-45, GREEDY_BELOW / 2):
        rows = RowSettings.uniform(t, 0, 1.0, 6, CPU)
        token, logprob = draw(logits, rows, torch.rand(6), keep=True)
        assert torch.equal(token, logits.argmax(-1))
        want = logits.log_softmax(-1).gather(1, token[:, None])[:, 0]
        assert torch.allclose(logprob, want, atol=1e-6)


def test_top_k_one_is_greedy() -> None:
    logits = torch.randn(16, 40, generator=torch.Generator().manual_seed(2))  # (N, V)
    for u in (1e-6, 0.3, 1.0):
        token, _ = draw(logits, RowSettings.uniform(1.3, 1, 1.0, 16, CPU), torch.full((16,), u))
        assert torch.equal(token, logits.argmax(-1))


def test_top_k_keeps_the_k_most_likely_per_row() -> None:
    logits = torch.randn(3, 30, generator=torch.Generator().manual_seed(3))  # (N, V)
    kept = filter_logits(logits, torch.tensor([2, 0, 7]), 1.0).isfinite()  # (N, V)
    assert kept.sum(1).tolist() == [2, 30, 7]
    for i, k in ((0, 2), (2, 7)):
        assert set(kept[i].nonzero().flatten().tolist()) == set(logits[i].topk(k).indices.tolist())


def test_top_p_keeps_the_tokens_before_the_mass_is_reached() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(3, 4)  # (N, V)
    kept = filter_logits(logits, 0, torch.tensor([[0.7], [2.0], [0.4]])).isfinite()
    assert kept.tolist() == [[True, True, False, False], [True] * 4, [True, False, False, False]]
    # the draws follow the renormalised kept mass: 0.5 / 0.8 and 0.3 / 0.8
    u = ((torch.arange(800) + 0.5) / 800).float()  # (800,) evenly spaced in (0, 1)
    rows = RowSettings.uniform(1.0, 0, 0.7, 800, CPU)
    token, _ = draw(probs.log().expand(800, 4), rows, u)
    assert token.bincount(minlength=4).tolist() == [500, 300, 0, 0]


def test_row_seeds_split_over_two_draws_draw_as_one() -> None:
    one = row_noise(torch.Generator(), 0, 6, 12, CPU, RowSeeds(5, list(range(6))))  # (6, T)
    first = row_noise(torch.Generator(), 0, 4, 12, CPU, RowSeeds(5, [0, 1, 2, 3]))
    second = row_noise(torch.Generator(), 0, 2, 12, CPU, RowSeeds(5, [0, 1]).shifted(4))
    assert torch.equal(torch.cat([first, second]), one)
    assert torch.equal(seeded_noise([(5, 4)], 5, CPU)[0], one[4, :5])  # prefixes of the stream
    stream = NoiseStream([(5, 2), (5, 3)], chunk=5)
    assert torch.equal(torch.stack([stream.step(t) for t in range(12)], 1), one[2:4])


def test_two_samplers_with_the_same_row_seeds_sample_as_one(model_and_tokenizer) -> None:  # noqa: ANN001
    model, tokenizer = model_and_tokenizer
    params = GenerationParams(max_new_tokens=10, temperature=0.8, top_k=20, top_p=0.9)
    prompts = ["abc", "hello", "xy"]
    sampler = PlainSampler(model, tokenizer, torch.Generator())
    seeds = RowSeeds(17, list(range(6)))
    whole = sampler.generate(prompts, 2, params, seeds=seeds)
    half = [
        PlainSampler(model, tokenizer, torch.Generator()).generate(
            part, 2, params, seeds=RowSeeds(17, rows)
        )
        for part, rows in ((prompts[:2], [0, 1, 2, 3]), (prompts[2:], [4, 5]))
    ]
    assert [*half[0].texts, *half[1].texts] == whole.texts
    assert len(set(whole.texts)) > 1
