"""LoraHost.sample: num_samples sequences, the sampler's log-probs, seeds, stops, weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.workers.tinker.test_host import ADAM, train
from workers.tinker.types import LoraConfig, SamplingParams, TinkerInputError


@pytest.fixture
def host(make_host):  # noqa: ANN001, ANN201
    host = make_host()
    host.create_run("a", LoraConfig(rank=8))
    train(host, "a", 2)
    return host


def teacher_forced(host, weights: str | None, prompt: list[int], tokens: list[int]) -> list[float]:  # noqa: ANN001
    name = host._runs[weights].name if weights in host._runs else None
    ids = torch.tensor([prompt + tokens], device=host.model.device)
    with torch.no_grad(), host.adapters.active(name):
        logits = host.model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    return (
        logits.log_softmax(-1)
        .gather(1, torch.tensor(tokens, device=ids.device)[:, None])[:, 0]
        .tolist()
    )


def test_samples_with_their_logprobs(host) -> None:  # noqa: ANN001
    prompt = host.tokenizer("abc=")["input_ids"]
    params = SamplingParams(max_tokens=12, seed=7, top_k=50, stop=[])
    out = host.sample("a", prompt, 4, params, prompt_logprobs=True)
    assert len(out.sequences) == 4
    assert len({tuple(s.tokens) for s in out.sequences}) > 1  # rows draw their own noise
    for seq in out.sequences:
        assert len(seq.tokens) == 12 and seq.stop_reason == "length"
        assert seq.logprobs == pytest.approx(
            teacher_forced(host, "a", prompt, seq.tokens), abs=1e-5
        )
    assert out.prompt_logprobs[0] is None
    want = teacher_forced(host, "a", prompt[:1], prompt[1:])
    assert out.prompt_logprobs[1:] == pytest.approx(want, abs=1e-5)
    again = host.sample("a", prompt, 4, params)
    assert [s.tokens for s in again.sequences] == [s.tokens for s in out.sequences]
    assert again.prompt_logprobs is None
    other = host.sample("a", prompt, 4, SamplingParams(max_tokens=12, seed=8, stop=[]))
    assert [s.tokens for s in other.sequences] != [s.tokens for s in out.sequences]


def test_temperature_logprobs_are_the_tempered_policy(host) -> None:  # noqa: ANN001
    prompt = host.tokenizer("xy")["input_ids"]
    out = host.sample(
        None, prompt, 2, SamplingParams(max_tokens=5, temperature=0.5, seed=1, stop=[])
    )
    ids = torch.tensor([prompt + out.sequences[0].tokens], device=host.model.device)
    with torch.no_grad(), host.adapters.active(None):
        logits = host.model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / 0.5
    want = logits.log_softmax(-1).gather(1, ids[0, len(prompt) :, None])[:, 0]
    assert out.sequences[0].logprobs == pytest.approx(want.tolist(), abs=1e-5)


def test_stops_end_sequences(host) -> None:  # noqa: ANN001
    prompt = host.tokenizer("abc")["input_ids"]
    free = host.sample("a", prompt, 3, SamplingParams(max_tokens=10, seed=3, stop=[]))
    first = free.sequences[0].tokens
    stop_id = first[2]
    cut = host.sample("a", prompt, 3, SamplingParams(max_tokens=10, seed=3, stop=[stop_id]))
    seq = cut.sequences[0]
    assert seq.stop_reason == "stop" and seq.tokens == first[: first.index(stop_id) + 1]
    text = host.tokenizer.decode(first[1:3])
    by_text = host.sample("a", prompt, 3, SamplingParams(max_tokens=10, seed=3, stop=text))
    assert by_text.sequences[0].stop_reason == "stop"
    assert text in host.tokenizer.decode(by_text.sequences[0].tokens)
    assert len(by_text.sequences[0].tokens) <= 3
    greedy = host.sample("a", prompt, 2, SamplingParams(max_tokens=4, temperature=0.0))
    assert greedy.sequences[0].tokens == greedy.sequences[1].tokens


def test_weights_run_sampler_dir_or_base(host, tmp_path: Path) -> None:  # noqa: ANN001
    prompt = host.tokenizer("abc=")["input_ids"]
    params = SamplingParams(max_tokens=8, seed=5, stop=[])
    host.save_for_sampler("a", tmp_path / "w")
    run = host.sample("a", prompt, 2, params)
    saved = host.sample(str(tmp_path / "w"), prompt, 2, params)
    base = host.sample(None, prompt, 2, params)
    assert [s.tokens for s in saved.sequences] == [s.tokens for s in run.sequences]
    for a, b in zip(saved.sequences, run.sequences, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert [s.logprobs for s in base.sequences] != [s.logprobs for s in run.sequences]
    host.optim_step("a", ADAM)  # no gradients pending: the adapter stays; sampling still works
    with pytest.raises(TinkerInputError) as err:
        host.sample(str(tmp_path / "nowhere"), prompt, 1, params)
    assert err.value.field == "weights"


def test_a_cache_that_cannot_be_copied_prefills_each_row(host, monkeypatch) -> None:  # noqa: ANN001
    import workers.tinker.sampler as sampler

    prompt = host.tokenizer("abc=")["input_ids"]
    params = SamplingParams(max_tokens=6, seed=11, stop=[])
    shared = host.sample("a", prompt, 3, params)
    monkeypatch.setattr(sampler, "copyable", lambda cache: False)
    each = host.sample("a", prompt, 3, params)
    assert [s.tokens for s in each.sequences] == [s.tokens for s in shared.sequences]
    for a, b in zip(each.sequences, shared.sequences, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
