"""Episodes on the model: the token sequence of a multi-turn episode, and GRPO's masks on it.

The environment here is an in-test `EnvironmentSession` (the seam of workers/environments);
the sampler, the loop (`run_episodes`) and the forwards are the real ones. Training runs on the
real sandboxed host are in test_episode_training.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from workers.environments import StepResult, ToolCall, run_episodes
from workers.grpo.backend import ReferenceBackend
from workers.grpo.config import GenerationParams, GRPOParams
from workers.grpo.episode_rollout import EpisodeRollout
from workers.grpo.episodes import ModelPolicy
from workers.grpo.fast import FastBackend
from workers.grpo.fast.logprobs import completion_logits
from workers.grpo.loss import loss_denominator
from workers.grpo.rollout_rows import rollout_rows
from workers.grpo.sampling import PlainSampler
from workers.grpo.tiny_model import CHAT_TEMPLATE
from workers.grpo.update import accumulate_gradients

AGAIN = "Say it again."
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b",
          "parameters": {"type": "object", "properties": {}}}}]  # fmt: skip
# The tiny template, listing the tools first: shows what `tools=` puts in the first prompt.
TOOLS_TEMPLATE = CHAT_TEMPLATE.replace(
    "{{ bos_token }}",
    "{{ bos_token }}{% if tools %}tools: {{ tools | map(attribute='function.name') | join(',') }}"
    "\n{% endif %}",
)


class TwoTurns:
    """An EnvironmentSession: turn 1 is answered with "Say it again.", turn 2 ends the episode;
    each step rewards the share of the record's digit in the turn."""

    def __init__(self, tools: list[dict] | None = None) -> None:
        self._tools = tools or []

    def tools(self) -> list[dict[str, Any]]:
        return self._tools

    def reset(self, records: list[dict]) -> list[str]:
        return [r["prompt"] for r in records]

    def step(self, batch: list[tuple[list[dict], dict]]) -> list[StepResult]:
        out = []
        for messages, record in batch:
            turns = [m["content"] for m in messages if m["role"] == "assistant"]
            reward = sum(c == str(record["digit"]) for c in turns[-1]) / max(1, len(turns[-1]))
            done = len(turns) >= 2
            out.append(StepResult(None if done else AGAIN, reward, done))
        return out

    def call_tools(self, calls: list[ToolCall]) -> list[str]:
        return ["42" for _ in calls]

    def close(self) -> None:
        return None


class Spy:
    """The real sampler, keeping each call's prompts and sampled ids."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls, self.cut = inner, [], []

    def generate(self, prompts, group_size, params, keep_logprobs=False, first_row=0):
        out = self.inner.generate(prompts, group_size, params, keep_logprobs, first_row)
        sampled = [out.completion_ids[i, : out.lengths[i]].tolist() for i in range(len(prompts))]
        self.calls.append(([list(p) for p in prompts], sampled))
        self.cut.append(out.truncated.tolist())  # which turns hit max_new_tokens
        return out


RECORDS = [{"prompt": "Digit 3:", "digit": 3}, {"prompt": "Digit 7:", "digit": 7}]
GEN = GenerationParams(max_new_tokens=6)


def _spans(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) runs of a 0/1 mask."""
    runs, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((mask[start], start, i))
            start = i
    return runs


def test_an_episode_is_the_prompt_the_sampled_ids_and_the_template_between(chat_model) -> None:
    model, tok = chat_model
    spy = Spy(PlainSampler(model, tok, torch.Generator().manual_seed(0)))
    policy = ModelPolicy(spy, tok, GEN)
    episodes = run_episodes(TwoTurns(), RECORDS, policy, max_turns=4)

    assert [ep.turns for ep in episodes] == [2, 2] and len(spy.calls) == 2
    for i, ep in enumerate(episodes):
        seq = policy.episodes[i]
        first = tok.apply_chat_template(ep.messages[:1], tokenize=False, add_generation_prompt=True)
        assert seq.prompt == tok(first, add_special_tokens=False)["input_ids"]
        turn1, turn2 = spy.calls[0][1][i], spy.calls[1][1][i]
        runs = _spans(seq.model_mask)
        assert [v for v, *_ in runs] == [1, 0, 1]
        (_, a, b), (_, c, d), (_, e, f) = runs
        assert seq.completion[a:b] == turn1 and seq.completion[e:f] == turn2  # ids as sampled
        between = tok.decode(seq.completion[c:d])
        assert between in (f"\nuser: {AGAIN}\nassistant:", f" \nuser: {AGAIN}\nassistant:")
        # turn 2 was prompted with turn 1's exact ids: nothing of the model's was re-tokenised
        assert spy.calls[1][0][i] == seq.prompt + seq.completion[:e]
        assert tok.decode(turn2, skip_special_tokens=True) == ep.messages[3]["content"]


def test_tools_are_in_the_first_prompt_and_tool_messages_carry_no_loss(chat_model) -> None:
    model, tok = chat_model
    tok.chat_template = TOOLS_TEMPLATE
    try:
        policy = ModelPolicy(PlainSampler(model, tok, torch.Generator().manual_seed(1)), tok, GEN)
        transcript = [{"role": "user", "content": "2+40?"}]
        policy.begin([transcript], [0])
        [text] = policy.act([transcript], TOOLS)
        transcript += [
            {"role": "assistant", "content": text},
            {"role": "tool", "tool_call_id": "call_1", "name": "add", "content": "42"},
        ]
        policy.act([transcript], TOOLS)
    finally:
        tok.chat_template = CHAT_TEMPLATE
    seq = policy.episodes[0]
    assert tok.decode(seq.prompt).startswith("<bos>tools: add\nuser: 2+40?")
    (_, c, d) = [r for r in _spans(seq.model_mask) if r[0] == 0][0]
    assert tok.decode(seq.completion[c:d]).lstrip(" ") == "\ntool: 42\nassistant:"


@pytest.mark.parametrize("backend", [ReferenceBackend(), FastBackend()], ids=lambda b: b.name)
def test_loss_gradient_is_zero_on_observation_tokens(chat_model, backend) -> None:
    """d loss / d logits at every position that predicts an observation token is 0, and not
    at the model's tokens: through the step's own `accumulate_gradients` (loss, KL, entropy)."""
    model, tok = chat_model
    sampler = backend.sampler(model, tok, torch.Generator().manual_seed(2))
    out, _, _ = EpisodeRollout(TwoTurns(), tok, 4, None).play(
        RECORDS, sampler, [], 2, GEN, False, lambda *_: None
    )
    model_mask, attended = out.model_mask, out.completion_mask  # (N, T)
    observation = (attended == 1) & (model_mask == 0)
    assert observation.any() and (model_mask == 1).any()
    captured: list[torch.Tensor] = []

    def keep(_m: Any, _i: Any, logits: torch.Tensor) -> None:
        logits.retain_grad()
        captured.append(logits)

    hook = model.lm_head.register_forward_hook(keep)
    grpo = GRPOParams(beta=0.04, group_size=2, prompts_per_step=2)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])  # (N,)
    ref_lp = torch.full(attended.shape, -3.0)  # (N, T) a KL term with a gradient everywhere
    try:
        model.train()
        stats = accumulate_gradients(
            model, out, out.sampled_mask, advantages, None, ref_lp, grpo, GEN,
            loss_denominator(out.sampled_mask, grpo.loss_aggregation, GEN.max_new_tokens),
            True, backend=backend,
        )  # fmt: skip
    finally:
        hook.remove()
        model.zero_grad(set_to_none=True)
        model.eval()
    [logits] = captured
    grad = _per_position(model, out, backend, logits.grad)  # (N, T) |grad| per position
    assert torch.all(grad[observation] == 0)
    assert torch.all(grad[model_mask == 1] > 0)
    assert torch.isfinite(stats["entropy"]) and stats["entropy"] > 0


def _per_position(model: Any, out: Any, backend: Any, grad: torch.Tensor) -> torch.Tensor:
    """The logits' gradient norm at each completion position (N, T)."""
    n, t = out.completion_ids.shape
    if backend.name == "reference":  # (N, T + 1, V): position j predicts completion token j
        return grad[:, :t].abs().sum(-1)
    with torch.no_grad():  # the lean forward's rows and the flat positions they predict
        _, where = completion_logits(
            model, out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask,
            lengths=out.lengths, groups=None,
        )  # fmt: skip
    flat = torch.zeros(n * t).index_copy(0, where, grad.reshape(-1, grad.shape[-1]).abs().sum(-1))
    return flat.view(n, t)


def test_episode_generation_masks_and_metrics(chat_model) -> None:
    model, tok = chat_model
    sampler = PlainSampler(model, tok, torch.Generator().manual_seed(3))
    events: list[tuple] = []
    out, scored, played = EpisodeRollout(TwoTurns(), tok, 4, None).play(
        RECORDS, sampler, [], 2, GEN, True, lambda *e: events.append(e)
    )
    assert out.group_size == 2 and out.lengths == out.completion_mask.sum(1).int().tolist()
    assert torch.all(out.logprobs[out.model_mask == 0] == 0)
    assert torch.all(out.logprobs[out.model_mask == 1] < 0)
    m = scored.metrics
    assert m["turns_mean"] == 2 and m["tool_calls_mean"] == 0 and m["errors/environment"] == 0
    assert m["completion_tokens"] == out.model_mask.sum().item()
    assert m["episode_len_mean"] == pytest.approx(
        (out.prompt_mask.sum() + out.completion_mask.sum()).item() / 4
    )
    assert torch.allclose(scored.rewards, torch.tensor([sum(r) for r in played.turn_rewards]))
    turn1 = [r[0] for r in played.turn_rewards]
    assert m["reward_turn/1"] == pytest.approx(sum(turn1) / 4)
    assert [len(t) for t in played.transcripts] == [4] * 4 and not events


def test_an_episode_whose_last_turn_hits_max_new_tokens_reports_truncation(chat_model) -> None:
    """As a single completion would: its row says `length` and `truncated`, and the step's
    `truncated_frac` (the mean of `Generation.truncated`, trainer.py) counts it."""
    model, tok = chat_model
    spy = Spy(PlainSampler(model, tok, torch.Generator().manual_seed(3)))
    short = GenerationParams(max_new_tokens=3)  # a random model rarely ends a turn this soon
    out, scored, played = EpisodeRollout(TwoTurns(), tok, 4, None).play(
        RECORDS, spy, [], 2, short, False, lambda *e: None
    )
    assert len(spy.cut) == 2  # every episode's last turn is its second, all in the last call
    last_turn_cut = spy.cut[-1]
    assert any(last_turn_cut) and [len(t) for t in played.transcripts] == [4] * 4
    assert out.truncated.tolist() == last_turn_cut
    rows = rollout_rows(
        1, "train", tok, RECORDS, [0, 1], out, scored.rewards, scored.scores, scored.errors,
        None, played.transcripts, played.turn_rewards,
    )  # fmt: skip
    assert [r["truncated"] for r in rows] == last_turn_cut
    assert [r["finish_reason"] for r in rows] == ["length" if c else "stop" for c in last_turn_cut]
