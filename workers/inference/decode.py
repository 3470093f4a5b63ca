"""One batch of requests decoded together: prompts left-padded, the model's forward and KV
cache one token at a time, each row with its own sampling (temperature, top_k, top_p, stop
strings, max_tokens, its request's seed, log-probs).

Per token, every row's draw is the engine's one kernel (`workers.grpo.draw.draw`) on the batch
with each row's own settings: a temperature below `GREEDY_BELOW` (0 included) takes the argmax;
otherwise softmax(logits / T) restricted to the top_k tokens and the top_p nucleus, drawn at the
row's own uniform. A row's uniforms come from its request's seed (a fresh one when it names
none) and the choice's index alone, so a seeded request gives the same tokens whatever else
shares its batch (up to float rounding of the padded batch). Reported log-probs are the model's
own, log softmax(logits), before temperature, top_k and top_p. A row ends at EOS ("stop"), at a
stop string (the text is cut before it: "stop"; looked for in the newly decoded text only,
`workers.grpo.stops`) or at its max_tokens ("length"), or when its request is cancelled (its
client went away). Rows that have ended leave the batch (their KV-cache rows too), so the others
decode on; the loop ends when every row has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from workers.grpo.draw import NoiseStream, RowSettings, draw, fresh_base
from workers.grpo.sampling import cache_keyword
from workers.grpo.stops import StopScan
from workers.grpo.text import pad_id, render_prompt
from workers.inference.params import Choice, Request, RequestError, Result, TokenLogprob

CANCELLED = "cancelled"  # a row's finish_reason once its request is cancelled (never sent)


@dataclass
class _Row:
    request: int  # index into the batch's requests
    choice: Choice
    seed: tuple[int, int]  # its noise: the request's seed, the choice's index
    max_tokens: int
    scan: StopScan  # its text and where it ends
    emitted: int = 0  # characters of text already handed to on_delta
    pending: list[TokenLogprob] = field(default_factory=list)  # log-probs not yet handed over


def context_length(model: Any) -> int:
    config = model.config
    return int(getattr(config, "max_position_embeddings", 0) or 2048)


def encode(tokenizer: Any, prompt: Any) -> list[int]:
    text, templated = render_prompt(tokenizer, prompt)
    return tokenizer(text, add_special_tokens=not templated)["input_ids"]


def prompt_ids(model: Any, tokenizer: Any, req: Request) -> list[int]:
    """The request's prompt tokens; RequestError when they and max_tokens do not fit."""
    ids, limit = encode(tokenizer, req.prompt), context_length(model)
    if len(ids) >= limit or len(ids) + (req.sampling.max_tokens or 0) > limit:
        raise RequestError(
            f"the prompt ({len(ids)} tokens) plus max_tokens ({req.sampling.max_tokens}) "
            f"exceed the model's context of {limit} tokens"
        )
    return ids


def _rows(
    requests: list[Request], prompts: list[list[int]], limit: int, tokenizer: Any
) -> list[_Row]:
    rows, eos = [], {tokenizer.eos_token_id}
    for r, (req, ids) in enumerate(zip(requests, prompts, strict=True)):
        seed = req.sampling.seed if req.sampling.seed is not None else fresh_base()
        cap = req.sampling.max_tokens or limit - len(ids)
        for i in range(req.n):
            scan = StopScan(tokenizer, eos, req.sampling.stop)
            rows.append(_Row(r, Choice(i), (seed, i), cap, scan))
    return rows


def _settings(rows: list[_Row], requests: list[Request]) -> RowSettings:
    """Every row's sampling settings (its request's)."""
    s = [requests[r.request].sampling for r in rows]
    return RowSettings(tuple(x.temperature for x in s), tuple(x.top_k for x in s),
                       tuple(x.top_p for x in s), torch.device("cpu"))  # fmt: skip


def _logprobs(logp: Tensor, token: int, k: int, tokenizer: Any) -> TokenLogprob:
    """The chosen token's log-prob and the k most likely, from one row's log-probs (V,)."""
    top = []
    if k > 0:
        values, ids = torch.topk(logp, k)
        top = [(tokenizer.decode([t]), float(v)) for v, t in zip(values, ids.tolist(), strict=True)]
    return TokenLogprob(tokenizer.decode([token]), float(logp[token]), top)


def _advance(row: _Row, token: int, req: Request) -> None:
    """Append one token to a row: end it at EOS, a stop string or max_tokens, and hand any
    text that is certain to stay (not a possible stop-string prefix) to `on_delta`."""
    row.choice.completion_tokens += 1
    if row.scan.push(token):
        row.choice.finish_reason = "stop"
    elif row.choice.completion_tokens >= row.max_tokens:
        row.choice.finish_reason = "length"
    done = row.choice.finish_reason is not None
    text = row.scan.text() if done else row.scan.row.text
    safe = len(text) if done else row.scan.settled()
    row.choice.text = text
    if safe > row.emitted or (done and row.pending):
        if req.on_delta is not None:
            req.on_delta(row.choice.index, text[row.emitted : safe], row.pending)
        row.choice.logprobs.extend(row.pending)
        row.pending = []
        row.emitted = max(row.emitted, safe)


@torch.no_grad()
def decode(
    model: Any, tokenizer: Any, requests: list[Request], prompts: list[list[int]]
) -> list[Result]:
    """Decode every request of the batch (`prompts`: each one's `prompt_ids`)."""
    rows = _rows(requests, prompts, context_length(model), tokenizer)
    device, pad = model.device, pad_id(tokenizer)
    noise = NoiseStream([r.seed for r in rows])
    settings = _settings(rows, requests)  # of the live rows
    width = max(len(p) for p in prompts)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)  # (N, P)
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # (N, P)
    for i, row in enumerate(rows):
        p = prompts[row.request]
        ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(1) - 1).clamp(min=0)  # (N, P) left padding: real tokens from 0
    kw, cache = cache_keyword(model), None
    want = [requests[r.request].sampling.logprobs for r in rows]
    live = list(range(len(rows)))  # the rows still decoded (indices into `rows`), in order
    for t in range(max(r.max_tokens for r in rows)):
        res = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                    use_cache=True, logits_to_keep=1, **{kw: cache})  # fmt: skip
        cache = res[kw]
        logits = res.logits[:, -1].float().cpu()  # (A, V) the live rows
        tokens = draw(logits, settings, noise.step(t)[live])[0]  # (A,)
        with_lp = any(want[i] is not None for i in live)
        logp = logits.log_softmax(-1) if with_lp else None  # (A, V)
        for j, i in enumerate(live):
            row, req = rows[i], requests[rows[i].request]
            if row.choice.finish_reason is None and req.cancelled:
                row.choice.finish_reason = CANCELLED
            if row.choice.finish_reason is not None:
                tokens[j] = pad  # ended rows feed pads while the cache cannot drop them
                continue
            token = int(tokens[j])
            if logp is not None and want[i] is not None:
                row.pending.append(_logprobs(logp[j], token, want[i] or 0, tokenizer))
            _advance(row, token, req)
        going = [j for j, i in enumerate(live) if rows[i].choice.finish_reason is None]
        if not going:
            break
        if len(going) < len(live) and hasattr(cache, "reorder_cache"):
            # the rows that ended (or were cancelled) leave the batch, their cache rows too
            keep = torch.tensor(going, device=device)  # (A',)
            cache.reorder_cache(keep)
            mask, positions, tokens = mask[keep], positions[keep], tokens[going]
            live, settings = [live[j] for j in going], settings.select(going)
        ids = tokens.unsqueeze(1).to(device)  # (A, 1) the next forward feeds the new tokens
        positions = positions[:, -1:] + 1  # (A, 1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)  # (A, S + 1)
    results = [Result(len(p), []) for p in prompts]
    for row in rows:
        results[row.request].choices.append(row.choice)
    return results
