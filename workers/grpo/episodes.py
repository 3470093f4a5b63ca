"""The model as the policy of multi-turn episodes (`workers.environments.run_episodes`).

Each turn, every episode still going is one prompt: its token sequence so far, fed as ids
(`text.TokenIds`) to the job's own sampler (reference or fast: the same `Sampler.generate`);
the sampled ids are decoded for the transcript and kept as they are, never re-tokenised.
An episode's sequence is

    first prompt (chat template, with the session's `tools=`)             prompt tokens
    + turn 1's sampled ids                                                 model mask 1
    + what the template adds for the tool / observation messages and the
      next generation prompt (the transcript rendered before and after;
      only the added text is tokenised)                                    model mask 0
    + turn 2's sampled ids                                                 model mask 1 ...

Each turn's prompts are the whole sequences. A sampler that can (`continues`: the reference
and the fast one) keeps the batch's KV cache and prefills only what was added since (the
template's text and the observation): the same draws as re-encoding, without its prefill of
the earlier turns; any other sampler re-encodes every sequence each turn. With a `seed` (one draw
of the run's generator per batch of episodes), turn t's noise is named, not drawn
(`draw.RowSeeds`): base seed + t * stride, each row the episode's index in the batch. An
episode's draws then depend on neither which episodes are still going nor how many turns the
others take: on N processes (each plays its run of the batch, its rows shifted by its offset)
the episodes are one process's. An episode whose sequence plus one turn would not fit the
model's context ends there, truncated, with an error (nothing is fed past it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from workers.grpo.config import GenerationParams
from workers.grpo.draw import RowSeeds
from workers.grpo.sampling import Continuation, Sampler
from workers.grpo.text import Prompt, TokenIds

# For a tokenizer without a chat template: `role: content` lines, then `assistant:`.
PLAIN_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
_TURN_STRIDE = 0xD1B54A32D192ED03  # odd 64-bit constant: each turn's base far from the others


@dataclass
class EpisodeTokens:
    """One episode's token sequence as the model saw and wrote it."""

    prompt: list[int]  # the first prompt's tokens
    completion: list[int] = field(default_factory=list)  # everything after the first prompt
    model_mask: list[int] = field(default_factory=list)  # 1 on sampled ids, per completion token
    logprobs: list[float] = field(default_factory=list)  # the sampler's, 0 off model tokens
    rendered: int = 0  # messages of the transcript already in the sequence
    last_text: str = ""  # the last turn's decoded text, as the transcript holds it
    last_special: str = ""  # the special token the last turn ended with ("" if none)
    truncated: bool = False  # the context is full
    last_cut: bool = False  # the last turn sampled ended at max_new_tokens (no EOS, no stop)
    errors: list[str] = field(default_factory=list)

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.completion)


class ModelPolicy:
    """`workers.environments.Policy` through `sampler`. `begin` names each transcript's episode
    (the loop keeps the transcript objects); `episodes[i]` then holds episode i's tokens."""

    def __init__(
        self,
        sampler: Sampler,
        tokenizer: Any,
        params: GenerationParams,
        context: int | None = None,
        keep_logprobs: bool = False,
        seed: int | None = None,
        continue_cache: bool = True,
    ) -> None:
        """`continue_cache=False` re-encodes every turn even with a sampler that `continues`."""
        self.sampler, self.tokenizer, self.params = sampler, tokenizer, params
        self.context, self.keep_logprobs, self.seed = context, keep_logprobs, seed
        self.continues = continue_cache and bool(getattr(sampler, "continues", False))
        self._cache: Continuation | None = None  # the last turn's KV cache
        self._cache_rows: dict[int, int] = {}  # episode index -> its row in that cache
        self.turn = 0  # act calls so far: every episode still going takes its turn in each
        self.episodes: dict[int, EpisodeTokens] = {}  # episode index -> tokens
        self._index: dict[int, int] = {}  # id(transcript) -> episode index
        self.template = None if getattr(tokenizer, "chat_template", None) else PLAIN_TEMPLATE
        self.turn_tokens = 0  # every id sampled, for throughput and usage

    def begin(self, transcripts: list[list[dict]], indices: list[int]) -> None:
        self._index = {id(t): i for t, i in zip(transcripts, indices, strict=True)}

    def act(self, transcripts: list[list[dict]], tools: list[dict[str, Any]]) -> list[str | None]:
        going: list[tuple[int, EpisodeTokens]] = []
        for k, transcript in enumerate(transcripts):
            ep = self._episode(transcript, tools)
            if not ep.truncated:
                going.append((k, ep))
        turns: list[str | None] = [None] * len(transcripts)
        self.turn += 1
        if not going:
            return turns
        prompts: list[Prompt] = [TokenIds(ep.prompt + ep.completion) for _, ep in going]
        named: dict[str, Any] = {}  # `seeds`, and a continuing sampler's cache keywords
        if self.seed is not None:
            base = (self.seed + _TURN_STRIDE * self.turn) % 2**64
            rows = [self._index[id(transcripts[k])] for k, _ in going]
            named["seeds"] = RowSeeds(base, rows)
        if self.continues:
            named |= self._resume([self._index[id(transcripts[k])] for k, _ in going])
        out = self.sampler.generate(
            prompts, 1, self.params, keep_logprobs=self.keep_logprobs, **named
        )
        self._cache = out.continuation
        lengths = out.lengths or [int(n) for n in out.completion_mask.sum(1).tolist()]
        ids = out.completion_ids.tolist()
        cut = out.truncated.tolist()  # (len(going),) one transfer, never per row
        kept = None if out.logprobs is None else out.logprobs.tolist()
        special = set(self.tokenizer.all_special_ids)
        for row, (k, ep) in enumerate(going):
            sampled = ids[row][: lengths[row]]
            ep.completion += sampled
            ep.model_mask += [1] * len(sampled)
            ep.logprobs += kept[row][: lengths[row]] if kept else [0.0] * len(sampled)
            last = sampled[-1] if sampled else None
            ep.last_special = self.tokenizer.decode([last]) if last in special else ""
            ep.last_text = turns[k] = out.texts[row]
            ep.last_cut = bool(cut[row])
            self.turn_tokens += len(sampled)
        return turns

    def _resume(self, episodes: list[int]) -> dict[str, Any]:
        """The sampler's cache keywords for a turn of `episodes` (indices): keep the cache and,
        when the last turn's holds every one of them, continue it on their rows."""
        named: dict[str, Any] = {"keep_cache": True}
        cache, rows = self._cache, self._cache_rows
        self._cache, self._cache_rows = None, {e: r for r, e in enumerate(episodes)}
        if cache is not None and all(e in rows for e in episodes):
            named["resume"] = cache.select([rows[e] for e in episodes])
        return named

    def _episode(self, transcript: list[dict], tools: list[dict[str, Any]]) -> EpisodeTokens:
        """Episode of `transcript`, its sequence brought up to the transcript's end; truncated
        (and left as it was) when that and one more turn would not fit the context."""
        index = self._index.get(id(transcript), len(self._index))
        self._index.setdefault(id(transcript), index)
        ep = self.episodes.get(index)
        if ep is None:
            ep = EpisodeTokens(prompt=self._tokens(self._render(transcript, tools)))
            ep.rendered, added = len(transcript), []
            self.episodes[index] = ep
        else:
            added = self._tokens(self._added(transcript, ep, tools))
        need = ep.length + len(added) + self.params.max_new_tokens
        if self.context is not None and need > self.context:
            ep.truncated = True
            ep.errors.append(
                f"the episode's {ep.length + len(added)} tokens and a turn of "
                f"{self.params.max_new_tokens} would pass the model's context of {self.context}"
                " tokens: episode truncated"
            )
            if not ep.model_mask:  # no turn sampled: nothing to train on, the prompt too long
                ep.prompt = []
            return ep
        ep.completion += added
        ep.model_mask += [0] * len(added)
        ep.logprobs += [0.0] * len(added)
        ep.rendered = len(transcript)
        return ep

    def _added(self, transcript: list[dict], ep: EpisodeTokens, tools: list[dict]) -> str:
        """The text the template puts after the model's last turn: the end of that assistant
        message (less a special token the model already wrote), the messages that followed it
        and the next generation prompt."""
        turn = ep.rendered  # the assistant message of the last turn
        before = self._render(transcript[:turn], tools)
        after = self._render(transcript, tools)
        content = str(transcript[turn].get("content") or "")
        start = len(before) if after.startswith(before) else _common_prefix(before, after)
        at = after.find(content, start) if content else -1
        tail = after[at + len(content) :] if at >= 0 else after[start:]
        if ep.last_special and tail.startswith(ep.last_special):
            tail = tail[len(ep.last_special) :]
        return tail

    def _render(self, messages: list[dict], tools: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=True, tokenize=False,
            chat_template=self.template,
        )  # fmt: skip

    def _tokens(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def episode_tensors(
    episodes: list[EpisodeTokens], pad: int, device: Any
) -> dict[str, torch.Tensor]:
    """The episodes as a `Generation`'s tensors: prompts left-padded (N, P), completions
    right-padded (N, T) with the attention mask (1 on every token), the model mask and the
    kept log-probs. An episode without tokens gets a one-pad prompt (a row attention can
    normalise) and no completion."""
    prompts = [ep.prompt or [pad] for ep in episodes]
    width_p = max(len(p) for p in prompts)
    width_c = max(1, *(len(ep.completion) for ep in episodes))
    n = len(episodes)
    prompt_ids = torch.full((n, width_p), pad, dtype=torch.long)  # (N, P)
    prompt_mask = torch.zeros((n, width_p), dtype=torch.long)  # (N, P)
    completion_ids = torch.full((n, width_c), pad, dtype=torch.long)  # (N, T)
    completion_mask = torch.zeros((n, width_c))  # (N, T)
    model_mask, logprobs = torch.zeros((n, width_c)), torch.zeros((n, width_c))  # (N, T)
    for i, (ep, prompt) in enumerate(zip(episodes, prompts, strict=True)):
        prompt_ids[i, width_p - len(prompt) :] = torch.tensor(prompt)
        prompt_mask[i, width_p - len(prompt) :] = 1
        t = len(ep.completion)
        if t:
            completion_ids[i, :t] = torch.tensor(ep.completion)
            completion_mask[i, :t] = 1.0
            model_mask[i, :t] = torch.tensor(ep.model_mask, dtype=torch.float)
            logprobs[i, :t] = torch.tensor(ep.logprobs)
    tensors = {
        "prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
        "completion_mask": completion_mask, "model_mask": model_mask, "logprobs": logprobs,
    }  # fmt: skip
    return {k: v.to(device) for k, v in tensors.items()}
