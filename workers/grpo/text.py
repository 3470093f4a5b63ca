"""Prompts in, completion texts out: the tokenizer's side of sampling (either decoder).

Prompts (a string, or chat messages rendered by the tokenizer's chat template) are tokenised and
left-padded into one batch; a `TokenIds` prompt is already token ids. A sequence ends at EOS
or at a stop string; its completion mask covers the tokens up to and including EOS (or the
token that completes a stop string), and its text is cut just after the stop string.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class TokenIds(tuple):
    """A prompt given as token ids, fed as they are (no template, no tokenizer call): an
    episode's sequence so far, whose model turns must keep the exact ids sampled."""


Prompt = str | list[dict[str, str]] | TokenIds


def pad_id(tokenizer: Any) -> int:
    return tokenizer.eos_token_id if tokenizer.pad_token_id is None else tokenizer.pad_token_id


def render_prompt(tokenizer: Any, prompt: Prompt) -> tuple[str, bool]:
    """Prompt text and whether it already holds special tokens (from a chat template)."""
    if isinstance(prompt, str):
        return prompt, False
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        return text, True
    return "\n".join(m["content"] for m in prompt), False


def encode_prompts(tokenizer: Any, prompts: list[Prompt]) -> tuple[Tensor, Tensor]:
    """Left-padded ids (B, P) and mask (B, P)."""
    ids = [list(p) if isinstance(p, TokenIds) else _encode(tokenizer, p) for p in prompts]
    width = max(len(r) for r in ids)
    out = torch.full((len(ids), width), pad_id(tokenizer), dtype=torch.long)  # (B, P)
    mask = torch.zeros((len(ids), width), dtype=torch.long)  # (B, P)
    for i, r in enumerate(ids):
        out[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r) :] = 1
    return out, mask


def _encode(tokenizer: Any, prompt: Prompt) -> list[int]:
    text, templated = render_prompt(tokenizer, prompt)
    return tokenizer(text, add_special_tokens=not templated)["input_ids"]


def encode_groups(
    tokenizer: Any, prompts: list[Prompt], group_size: int, device: Any
) -> tuple[Tensor, Tensor]:
    """Left-padded ids (N, P) and mask (N, P) on `device`, each prompt repeated for its group
    of `group_size` consecutive rows (N = len(prompts) * group_size)."""
    ids, mask = encode_prompts(tokenizer, prompts)  # (B, P)
    ids = ids.repeat_interleave(group_size, 0).to(device)  # (N, P)
    return ids, mask.repeat_interleave(group_size, 0).to(device)  # (N, P), (N, P)


def cut_completions(
    tokenizer: Any, tokens: Tensor, stop_len: list[int | None], stops: list[str]
) -> tuple[Tensor, Tensor, list[str], list[int]]:
    """Sampled tokens (N, T) cut to their ends: tokens (N, T') padded after the end, the float
    mask (N, T') up to and including EOS / stop, texts cut after a stop string, lengths."""
    eos, pad = tokenizer.eos_token_id, pad_id(tokenizer)
    n, width = tokens.shape
    is_eos = tokens == eos  # (N, T)
    first_eos = torch.where(is_eos.any(1), is_eos.float().argmax(1) + 1, width)  # (N,)
    lengths = [stop_len[i] or int(first_eos[i]) for i in range(n)]
    width = max(lengths)  # steps after the last end (if any) fed pads only: cut
    tokens = tokens[:, :width]  # (N, T')
    steps = torch.arange(width, device=tokens.device)  # (T',)
    length_t = torch.tensor(lengths, device=tokens.device)  # (N,)
    mask = (steps.unsqueeze(0) < length_t.unsqueeze(1)).float()  # (N, T')
    tokens = tokens.masked_fill(mask == 0, pad)  # (N, T')
    texts = [_cut(tokenizer, tokens[i, : lengths[i]], stops) for i in range(n)]
    return tokens, mask, texts, lengths


def _cut(tokenizer: Any, ids: Tensor, stops: list[str]) -> str:
    text = tokenizer.decode(ids, skip_special_tokens=True)
    ends = [text.find(s) + len(s) for s in stops if s in text]
    return text[: min(ends)] if ends else text
