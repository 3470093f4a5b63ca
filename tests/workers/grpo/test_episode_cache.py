"""Episodes continuing the sampler's KV cache across turns draw what re-encoding draws.

The same seed plays the same episodes twice through each sampler (the reference one, the fast
one's lean decoder and its model-forward path), once continuing its cache (only each turn's
new tokens prefilled) and once re-encoding every sequence: ids, masks, transcripts and
log-probs must agree. The environment makes rows differ in how many tokens they add per turn
and in when they end (some episodes stop early, EOS and stop strings end turns at different
steps), so the continued cache has holes where rows were padded.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from workers.environments import StepResult, ToolCall, run_episodes
from workers.grpo.config import GenerationParams
from workers.grpo.episodes import ModelPolicy
from workers.grpo.fast.lean_decode import LeanDecoder
from workers.grpo.fast.sampling import FastSampler
from workers.grpo.sampling import PlainSampler
from workers.grpo.text import TokenIds


class UnevenTurns:
    """An EnvironmentSession: record k's episode lasts `turns` turns (k-th episode fewer when
    `short`), each observation a different length per episode and turn."""

    def __init__(self, turns: int) -> None:
        self.turns = turns

    def tools(self) -> list[dict[str, Any]]:
        return []

    def reset(self, records: list[dict]) -> list[str]:
        return [r["prompt"] for r in records]

    def step(self, batch: list[tuple[list[dict], dict]]) -> list[StepResult]:
        out = []
        for messages, record in batch:
            turn = sum(m["role"] == "assistant" for m in messages)
            done = turn >= self.turns - record["k"] % 2  # odd records end a turn early
            observation = "Again" + "!" * ((record["k"] + turn) % 4)
            out.append(StepResult(None if done else observation, float(turn), done))
        return out

    def call_tools(self, calls: list[ToolCall]) -> list[str]:
        return []

    def close(self) -> None:
        return None


class Widths:
    """Counts the tokens each forward is fed (prefills and decode steps): the model's own and
    the lean decoder's."""

    def __init__(self, model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fed: list[int] = []
        self.handle = model.register_forward_pre_hook(self.hook, with_kwargs=True)
        lean_forward = LeanDecoder._forward

        def counted(decoder: LeanDecoder, ids: torch.Tensor, *args: Any, **kw: Any) -> Any:
            self.fed.append(int(ids.numel()))
            return lean_forward(decoder, ids, *args, **kw)

        monkeypatch.setattr(LeanDecoder, "_forward", counted)

    def hook(self, _module: Any, _args: Any, kwargs: dict) -> None:
        self.fed.append(int(kwargs["input_ids"].numel()))


RECORDS = [{"prompt": "Digit " + "7" * k + ":", "k": k} for k in range(6)]


SAMPLERS = {
    "reference": PlainSampler,
    "fast-lean": FastSampler,
    "fast-forward": lambda model, tok, gen: FastSampler(model, tok, gen, lean=False),
}


def _play(chat_model, engine, params, continue_cache: bool, monkeypatch, turns: int = 4):
    model, tok = chat_model
    sampler = SAMPLERS[engine](model, tok, torch.Generator().manual_seed(0))
    policy = ModelPolicy(sampler, tok, params, keep_logprobs=True, seed=1234,
                         continue_cache=continue_cache)  # fmt: skip
    with monkeypatch.context() as patch:
        widths = Widths(model, patch)
        try:
            episodes = run_episodes(UnevenTurns(turns), RECORDS, policy, max_turns=turns)
        finally:
            widths.handle.remove()
    return episodes, [policy.episodes[i] for i in range(len(RECORDS))], widths.fed


@pytest.mark.parametrize(
    "params",
    [
        GenerationParams(max_new_tokens=12, temperature=1.0),
        GenerationParams(max_new_tokens=12, temperature=0.7, top_p=0.9, stop=["a"]),
    ],
    ids=["plain", "stop-string"],
)
@pytest.mark.parametrize("engine", list(SAMPLERS))
def test_continuing_the_cache_draws_what_re_encoding_draws(
    chat_model, engine, params, monkeypatch
) -> None:
    again, again_tokens, fed_again = _play(chat_model, engine, params, False, monkeypatch)
    cont, cont_tokens, fed_cont = _play(chat_model, engine, params, True, monkeypatch)

    assert [ep.turns for ep in again] == [4, 3, 4, 3, 4, 3]
    for a, c in zip(again_tokens, cont_tokens, strict=True):
        assert c.prompt == a.prompt and c.completion == a.completion
        assert c.model_mask == a.model_mask
        assert c.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    assert [ep.messages for ep in cont] == [ep.messages for ep in again]
    # the turns ended at different steps: some rows were padded inside the continued cache
    lengths = {sum(a.model_mask) for a in again_tokens}
    assert len(lengths) > 1
    # continuing fed each later turn only its new tokens, not the sequence again
    assert sum(fed_cont) < sum(fed_again) / 2


def test_a_prompt_that_is_not_the_cache_plus_new_tokens_is_re_encoded(chat_model) -> None:
    model, tok = chat_model
    sampler = PlainSampler(model, tok, torch.Generator().manual_seed(0))
    params = GenerationParams(max_new_tokens=5)
    firsts = [TokenIds([1, 40, 41]), TokenIds([1, 42])]
    first = sampler.generate(firsts, 1, params, keep_cache=True)
    cached = first.continuation.tokens
    assert cached[0][:3] == [1, 40, 41] and cached[1][:2] == [1, 42]
    # row 1's prompt is not its cached ids plus more: the batch is re-encoded
    prompts = [TokenIds([*cached[0], 50]), TokenIds([1, 43, 50])]
    resumed = sampler.generate(prompts, 1, params, resume=first.continuation)
    sampler.generator.manual_seed(0)
    sampler.generate(firsts, 1, params)
    fresh = sampler.generate(prompts, 1, params)
    assert torch.equal(resumed.completion_ids, fresh.completion_ids)
