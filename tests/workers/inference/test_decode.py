"""The inference server's decode and Tinker's sampler draw through the engine's one kernel
(`workers.grpo.draw`): the same seed and settings give the tokens the kernel gives when driven
directly; one batch mixes requests of different settings, each decoding as when alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workers.grpo.draw import RowSettings, draw, seeded_noise
from workers.inference.decode import decode, prompt_ids
from workers.inference.params import ModelRef, Request, Sampling
from workers.tinker.sampler import Draw, StopRule, sample_sequences


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir: Path):  # noqa: ANN201
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


@torch.no_grad()
def kernel_rows(model, prompt: list[int], rows: RowSettings, seeds, steps: int, stop: set[int]):  # noqa: ANN001, ANN201
    """Each row's tokens drawn by the kernel directly, the whole sequence re-run every step."""
    noise = seeded_noise(seeds, steps, torch.device("cpu"))  # (N, T)
    n = len(seeds)
    seqs: list[list[int]] = [[] for _ in range(n)]
    for t in range(steps):
        going = [i for i in range(n) if not (seqs[i] and seqs[i][-1] in stop)]
        if not going:
            break
        logits = torch.stack(
            [model(input_ids=torch.tensor([prompt + seqs[i]])).logits[0, -1] for i in going]
        )  # (A, V)
        token, _ = draw(logits, rows.select(going), noise[going, t])
        for j, i in enumerate(going):
            seqs[i].append(int(token[j]))
    return seqs


def _request(ref: ModelRef, prompt: str, n: int, **sampling) -> Request:  # noqa: ANN003
    return Request(ref, prompt, Sampling(**sampling), n=n)


def test_inference_decode_draws_what_the_kernel_draws(model_and_tokenizer) -> None:  # noqa: ANN001
    model, tok = model_and_tokenizer
    ref = ModelRef("tiny")
    settings = [dict(temperature=0.8, top_k=12, seed=3), dict(temperature=0.0, seed=1),
                dict(temperature=1.2, top_p=0.8, seed=5)]  # fmt: skip
    texts = ["ab", "hello", "x"]
    pairs = zip(texts, settings, strict=True)
    requests = [_request(ref, p, 2, max_tokens=8, **s) for p, s in pairs]
    prompts = [prompt_ids(model, tok, r) for r in requests]
    together = decode(model, tok, requests, prompts)
    for req, ids, result in zip(requests, prompts, together, strict=True):
        s = req.sampling
        rows = RowSettings.uniform(s.temperature, s.top_k, s.top_p, 2, torch.device("cpu"))
        want = kernel_rows(model, ids, rows, [(s.seed, 0), (s.seed, 1)], 8, {tok.eos_token_id})
        texts = [tok.decode(w, skip_special_tokens=True) for w in want]
        assert [c.text for c in result.choices] == texts
        alone = decode(model, tok, [_request(ref, req.prompt, 2, **vars(s))], [ids])[0]
        assert [c.text for c in alone.choices] == texts
    assert together[1].choices[0].text == together[1].choices[1].text  # greedy


def test_tinker_sampler_draws_what_the_kernel_draws(model_and_tokenizer) -> None:  # noqa: ANN001
    model, tok = model_and_tokenizer
    prompt = tok("abc=")["input_ids"]
    for t, k, p in ((0.9, 10, 0.95), (0.0, 0, 1.0), (1.0, 1, 1.0)):
        seqs, _ = sample_sequences(model, tok, prompt, 3, Draw(t, k, p), 7,
                                   StopRule(frozenset(), ()), seed=21)  # fmt: skip
        rows = RowSettings.uniform(t, k, p, 3, torch.device("cpu"))
        want = kernel_rows(model, prompt, rows, [(21, i) for i in range(3)], 7, set())
        assert [s.tokens for s in seqs] == want
