"""GRPO steps 1-3 over episodes: a group is G episodes of one record, each scored as a whole.

The episodes are played by `workers.environments.run_episodes` (the one loop `/test` also
runs) with the model as the policy (`episodes.ModelPolicy`). An episode's reward is the sum of
its step rewards plus, when the job has verifiers, sum_k w_k * score_k of its final transcript
(the sample is the record with `messages`, the transcript, and `completion`, the last
assistant turn). The batch comes back as a `Generation` whose completion is everything after
the first prompt and whose `model_mask` marks the sampled ids: the loss, the KL and the entropy
see only those, and the episode's advantage reaches each of them (GRPO, outcome supervision).

An episode that errs (a step raising, a malformed result, an observation past the context) ends
there with its error counted (`errors/environment`, an `environment_errors` event); the job goes
on. An episode is truncated (`finish_reason: length`, counted in `truncated_frac`, dropped by
`mask_truncated_completions`) when the context or max_turns cut it, or when its last turn ended
at `max_new_tokens`, as a single completion would be. Episodes are regenerated from the step's
records and the run's generator: a resumed job replays from the step boundary with nothing
more in its checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workers.environments import EnvironmentSession, Episode, run_episodes
from workers.grpo.config import GenerationParams
from workers.grpo.distributed import WEIGHT
from workers.grpo.draw import draw_base
from workers.grpo.episodes import EpisodeTokens, ModelPolicy, episode_tensors
from workers.grpo.sampling import Generation, Sampler
from workers.grpo.scoring import Scored, Scorer, score_batch
from workers.grpo.text import pad_id

CHARS_PER_TOKEN = 8  # a transcript past context * this many characters cannot fit: cut early


@dataclass
class Played:
    """What the episodes of a batch leave for the step's rows: transcript and turn rewards."""

    transcripts: list[list[dict[str, Any]]]
    turn_rewards: list[list[float]]


class EpisodeRollout:
    """Plays and scores the episodes of a batch of records on one environment session."""

    def __init__(
        self,
        session: EnvironmentSession,
        tokenizer: Any,
        max_turns: int,
        context: int | None,
        device: Any = "cpu",
        generator: torch.Generator | None = None,
    ) -> None:
        self.session, self.tokenizer, self.device = session, tokenizer, device
        self.max_turns, self.context, self.generator = max_turns, context, generator

    @classmethod
    def of(
        cls, session: EnvironmentSession, policy: Any, max_turns: int, generator: torch.Generator
    ) -> EpisodeRollout:
        """For a run's policy (`policy.Policy`): its tokenizer, device and context length; the
        run's generator gives each batch of episodes its seed (`episodes.ModelPolicy`)."""
        model = policy.model
        context = getattr(model.config, "max_position_embeddings", None)
        return cls(session, policy.tokenizer, max_turns, context, model.device, generator)

    def play(
        self,
        records: list[dict],
        sampler: Sampler,
        scorers: Sequence[Scorer],
        group_size: int,
        gen: GenerationParams,
        keep_logprobs: bool,
        on_event: Callable[[str, str, dict], None],
    ) -> tuple[Generation, Scored, Played]:
        """G episodes of each record, group by group; their Generation, rewards and rows."""
        batch = [r for r in records for _ in range(group_size)]
        seed = None if self.generator is None else draw_base(self.generator)
        policy = ModelPolicy(sampler, self.tokenizer, gen, self.context, keep_logprobs, seed)
        max_chars = None if self.context is None else self.context * CHARS_PER_TOKEN
        episodes = run_episodes(self.session, batch, policy, self.max_turns, max_chars)
        tokens = [policy.episodes.get(i) or EpisodeTokens(prompt=[]) for i in range(len(batch))]
        for ep, tok in zip(episodes, tokens, strict=True):
            ep.errors += tok.errors
            # cut by the context, at max_turns, or (as a single completion) in its last turn
            ep.truncated = ep.truncated or tok.truncated or tok.last_cut
        out = _generation(tokens, episodes, group_size, keep_logprobs, self.tokenizer, self.device)
        scored = _score(scorers, batch, episodes, on_event)
        scored.metrics |= episode_metrics(episodes, tokens, self.max_turns)
        scored.metrics["completion_tokens"] = float(policy.turn_tokens)
        _report_errors(episodes, on_event)
        played = Played([ep.messages for ep in episodes], [list(ep.rewards) for ep in episodes])
        return out, scored, played


def _generation(
    tokens: list[EpisodeTokens],
    episodes: list[Episode],
    group_size: int,
    keep_logprobs: bool,
    tokenizer: Any,
    device: Any,
) -> Generation:
    t = episode_tensors(tokens, pad_id(tokenizer), device)
    lengths = [len(ep.completion) for ep in tokens]
    prompts = [tuple(ep.prompt) for ep in tokens]
    # The fast path shares a group's prompt when told its rows are equal: say so only if true.
    shared = all(
        len(set(prompts[i : i + group_size])) == 1 for i in range(0, len(prompts), group_size)
    )
    return Generation(
        t["prompt_ids"], t["prompt_mask"], t["completion_ids"], t["completion_mask"],
        [_last_turn(ep) for ep in episodes], torch.tensor([ep.truncated for ep in episodes]),
        t["logprobs"] if keep_logprobs else None, lengths, group_size if shared else None,
        model_mask=t["model_mask"],
    )  # fmt: skip


def _last_turn(ep: Episode) -> str:
    turns = [m for m in ep.messages if m.get("role") == "assistant"]
    return str(turns[-1].get("content") or "") if turns else ""


def _score(
    scorers: Sequence[Scorer],
    batch: list[dict],
    episodes: list[Episode],
    on_event: Callable[[str, str, dict], None],
) -> Scored:
    """Episode rewards (N,): step rewards summed, plus the verifiers' on the final transcript."""
    samples = [{**r, "messages": ep.messages} for r, ep in zip(batch, episodes, strict=True)]
    scored = score_batch(scorers, samples, [_last_turn(ep) for ep in episodes], 1, on_event)
    environment = torch.tensor([ep.reward for ep in episodes], dtype=torch.float)  # (N,)
    scored.rewards = scored.rewards + environment  # (N,)
    scored.metrics["reward/environment"] = environment.mean().item()
    errors = [float(bool(ep.errors)) for ep in episodes]
    scored.metrics["errors/environment"] = sum(errors)
    scored.errors["environment"] = ["; ".join(ep.errors) or None for ep in episodes]
    return scored


def episode_metrics(
    episodes: list[Episode], tokens: list[EpisodeTokens], max_turns: int
) -> dict[str, float]:
    """Means over the batch's episodes: turns, tool calls, the share of failed tool calls,
    tokens (prompt and completion), and `reward_turn/<k>` over the episodes with a k-th
    step reward (0 when none has one: every k up to max_turns, so that N processes report
    the same keys). The two means over a varying count carry it (`distributed.WEIGHT`), so
    that N processes weight them as one process does."""
    n = max(1, len(episodes))
    calls = sum(ep.tool_calls for ep in episodes)
    metrics = {
        "turns_mean": sum(ep.turns for ep in episodes) / n,
        "tool_calls_mean": calls / n,
        "tool_error_frac": sum(ep.tool_errors for ep in episodes) / calls if calls else 0.0,
        "tool_error_frac" + WEIGHT: float(calls),
        "episode_len_mean": sum(t.length for t in tokens) / n,
    }
    for k in range(max_turns):
        rewards = [ep.rewards[k] for ep in episodes if len(ep.rewards) > k]
        metrics[f"reward_turn/{k + 1}"] = sum(rewards) / len(rewards) if rewards else 0.0
        metrics[f"reward_turn/{k + 1}" + WEIGHT] = float(len(rewards))
    return metrics


def _report_errors(episodes: list[Episode], on_event: Callable[[str, str, dict], None]) -> None:
    failed = [ep for ep in episodes if ep.errors]
    if failed:
        on_event(
            "environment_errors",
            f"{len(failed)}/{len(episodes)} episodes ended on an error",
            {"count": len(failed), "first_error": failed[0].errors[0]},
        )
