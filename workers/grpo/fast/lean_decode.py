"""The decode loop's model: prefill and one-token steps with a static KV cache (sampling).

A static KV cache filled in place, RoPE on q and k in one go, and q/k/v and gate/up each one
fused matmul (weights concatenated once per `generate` call; on a CPU without packing, small
models only). For small models the op count, not the FLOPs, sets the decode time. On CPU in
fp32 the decode weights are also packed once per call into oneDNN's blocked layout: a few-row
product then streams the weights instead of re-packing them on every call. The packed copy
lives only while the batch decodes. The prefill runs each distinct prompt once (GRPO repeats
each G times). On CPU, when the rows form groups of equal size G > 1 and the prompts are long
enough (`SHARE_MIN_PROMPT_BYTES`), the prompt's keys and values stay once per group and each
decode step attends to them with the group's G queries in one product
(`shared_prompt_attention`): a step reads the prompt's cache once, not G times. Otherwise the
prefill copies them to each row's cache. The maths is `lean.LeanModel`'s.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from workers.grpo.fast.lean import (
    LeanModel,
    Tape,
    attention,
    onednn_matmul,
    prompt_mask_4d,
    supported,
)
from workers.grpo.fast.lean_forward import prompt_groups

FUSE_MAX_BYTES_CPU = 32 * 2**20  # unpacked fused weight copies allowed on CPU (count in RSS)
# Prompt keys + values of one group in one layer from which decode steps share them: below
# it, the shared attention's extra ops cost more than the G - 1 copies' reads they save
# (measured on CPU with `bench/shared_prompts.py`).
SHARE_MIN_PROMPT_BYTES = 64 * 2**10


def shared_prompt_attention(
    q: Tensor,
    prompt: tuple[Tensor, Tensor],
    prompt_bias: Tensor,
    keys: Tensor,
    values: Tensor,
    rows: Tensor | None = None,
    total: int = 0,
) -> Tensor:
    """Heads joined (A, 1, H * D) of one new position per row, q (A, H, 1, D), attending to
    its group's prompt and to its own completion so far: one softmax over both, as one
    attention over their concatenation. The `total` rows N form U groups of G consecutive
    rows; `rows` (A,) says which of them q holds (None: all, and N = A). `prompt`: keys,
    values (U, Hk, P, D); `prompt_bias` (U, 1, 1, P) 0 or -inf (padding); `keys`, `values`
    (A, Hk, C, D) the row's own positions, all attended to. Query head j reads key head
    j // (H / Hk), as grouped-query attention does."""
    a, h, _, d = q.shape
    (u, hk, p, _), c = prompt[0].shape, keys.shape[2]
    r = h // hk
    n = a if rows is None else total
    g = n // u
    q = q.reshape(a, hk, r, d) * d**-0.5  # (A, Hk, R, D)
    every = q if rows is None else q.new_zeros(n, hk, r, d).index_copy_(0, rows, q)  # (N, ...)
    grouped = every.view(u, g, hk, r, d).transpose(1, 2).reshape(u, hk, g * r, d)
    on_prompt = torch.matmul(grouped, prompt[0].transpose(-1, -2)) + prompt_bias  # (U, Hk, G R, P)
    on_prompt = on_prompt.view(u, hk, g, r, p).transpose(1, 2).reshape(n, hk, r, p)
    if rows is not None:
        on_prompt = on_prompt.index_select(0, rows)  # (A, Hk, R, P)
    on_own = torch.matmul(q, keys.transpose(-1, -2))  # (A, Hk, R, C)
    weights = torch.cat([on_prompt, on_own], -1).softmax(-1)  # (A, Hk, R, P + C)
    w_prompt, w_own = weights.split([p, c], -1)
    if rows is not None:
        w_prompt = w_prompt.new_zeros(n, hk, r, p).index_copy_(0, rows, w_prompt)
    w_prompt = w_prompt.reshape(u, g, hk, r, p).transpose(1, 2).reshape(u, hk, g * r, p)
    from_prompt = torch.matmul(w_prompt, prompt[1]).view(u, hk, g, r, d).transpose(1, 2)
    from_prompt = from_prompt.reshape(n, h, d)  # (N, H, D)
    if rows is not None:
        from_prompt = from_prompt.index_select(0, rows)  # (A, H, D)
    out = from_prompt + torch.matmul(w_own, values).view(a, h, d)  # (A, H, D)
    return out.reshape(a, 1, h * d)


class LeanDecoder:
    """Prefill and one-token decode steps with a static KV cache, for one batch."""

    @classmethod
    def build(cls, model: Any, total_length: int, rows: int) -> LeanDecoder | None:
        return cls(model, rows=rows) if supported(model, total_length) else None

    def __init__(
        self, model: Any, fuse: bool | None = None, pack: bool | None = None, rows: int = 16
    ) -> None:
        """`rows`: the batch size decode steps will have (packing is tuned for it); `fuse`,
        `pack`: None decides by device and size, as the module docstring says."""
        weight = model.get_input_embeddings().weight
        device = weight.device
        autocast = torch.is_autocast_enabled(device.type)  # matmuls in its dtype, weights cast once
        dtype = torch.get_autocast_dtype(device.type) if autocast else weight.dtype
        if pack is None:
            pack = onednn_matmul(device, dtype)
        elif pack and not onednn_matmul(device, dtype):
            raise ValueError(f"weights cannot be packed on {device} in {dtype}")
        if fuse is None:  # unpacked fused copies on CPU count against memory: small models only
            fused_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) * 0.7
            fuse = pack or device.type != "cpu" or fused_bytes <= FUSE_MAX_BYTES_CPU
        with torch.no_grad():
            self.lean = LeanModel(model, fuse, dtype, pack_rows=rows if pack else None)
        self.tape: Tape | None = None  # the decode steps' linear maps (replay.DecodeRecord)
        self.cache: list[tuple[Tensor, Tensor]] = []  # per layer (N, Hk, L, D) keys, values
        self.key_bias = torch.zeros(0, 0)  # (N, L) 0 on keys one may attend to, else -inf
        # Shared prompts: per layer (U, Hk, P, D) keys, values; then `cache` holds only the
        # completions' positions, from position `cached_from` on, and `prompt_bias` (U, 1, 1, P)
        # masks the prompts' padding.
        self.prompts: list[tuple[Tensor, Tensor]] = []
        self.prompt_bias = torch.zeros(0, 1, 1, 0)
        self.cached_from = 0
        self.rows: Tensor | None = None  # (A,) the rows of the batch still decoded; None: all
        self.total = 0  # rows N of the batch prefilled
        self.rope_table = (torch.zeros(0, 0), torch.zeros(0, 0))  # cos, sin (L, D) by position
        self.length = 0
        self.positions = torch.zeros(0, dtype=torch.long)  # (N,) position of the last token

    def _forward(
        self,
        ids: Tensor,
        rope: tuple[Tensor, Tensor],
        mask: Tensor,
        tape: Tape | None,
        group: Tensor | None = None,
    ) -> Tensor:
        """Logits (B, V) of the last position of the B rows `ids` (B, S); appends the S new
        positions to the cache. `rope`: cos, sin (B, 1, S, D) of the new positions. `group`
        (N,): in the prefill, the row of `ids` whose keys and values each cache row gets."""
        lean, start, end = self.lean, self.length, self.length + ids.shape[1]
        x = lean.embedding(ids)  # (B, S, E)
        cos, sin = rope
        for i, (keys, values) in enumerate(self.cache):
            q, k, v = lean.qkv(x, i, cos, sin, tape)  # (B, H|Hk, S, D)
            if group is not None:  # prefill (start 0): the new keys are all there is to attend to
                if self.prompts:
                    self.prompts[i] = (k.contiguous(), v.contiguous())  # (U, Hk, P, D)
                else:
                    keys[:, :, start:end], values[:, :, start:end] = k[group], v[group]
                o = attention(q, k, v, mask)  # (B, S, E)
            else:
                a, b = start - self.cached_from, end - self.cached_from
                keys[:, :, a:b], values[:, :, a:b] = k, v
                k, v = keys[:, :, :b], values[:, :, :b]  # (N, Hk, L, D)
                if self.prompts:
                    o = shared_prompt_attention(
                        q, self.prompts[i], self.prompt_bias, k, v, self.rows, self.total
                    )
                else:
                    o = attention(q, k, v, mask)  # (N, S, E)
            x = x + lean.linear_map(o, i, "out", tape)
            x = x + lean.mlp(x, i, tape)  # (B, S, E)
        self.length = end
        return lean.head(x[:, -1])  # (B, V)

    def prefill(
        self, ids: Tensor, attention_mask: Tensor, max_new_tokens: int, share: bool = True
    ) -> Tensor:
        """Run the left-padded prompts (N, P); logits (N, V) of the first new token.

        Each distinct prompt (GRPO repeats each G times, consecutively) runs through the
        layers once; its keys and values are kept once per group (CPU, groups of equal size,
        `share`) or copied to the cache rows of its group."""
        n, p = ids.shape
        rows = torch.cat([ids, attention_mask.to(ids.dtype)], 1)  # (N, 2P)
        unique, group, size = prompt_groups(rows, None, share=True)  # (U, 2P), (N,), G or None
        u = unique.shape[0]
        share = share and ids.device.type == "cpu" and size is not None and size > 1
        item = torch.finfo(self.lean.dtype).bits // 8
        prompt_bytes = 2 * p * self.lean.kv_heads * self.lean.head_dim * item
        share = share and prompt_bytes >= SHARE_MIN_PROMPT_BYTES
        self.cached_from, self.rows, self.total = (p if share else 0), None, n
        self._empty_cache(n, p + max_new_tokens - self.cached_from, ids.device)
        self.prompts = [(torch.zeros(0), torch.zeros(0))] * len(self.cache) if share else []
        # Per step, few ops: an additive key mask (0 or -inf) and RoPE looked up from a table.
        self.key_bias = torch.zeros(n, p + max_new_tokens, dtype=self.lean.dtype, device=ids.device)
        self.key_bias[:, :p].masked_fill_(attention_mask == 0, float("-inf"))
        self.prompt_bias = self.key_bias[:: n // u, None, None, :p] if share else self.prompt_bias
        table = torch.arange(p + max_new_tokens, device=ids.device).unsqueeze(0)  # (1, L)
        cos, sin = self.lean.rope(table)  # (1, 1, L, D)
        self.rope_table = cos[0, 0], sin[0, 0]  # (L, D)
        self.length = 0
        positions = (attention_mask.cumsum(1) - 1).clamp(min=0)  # (N, P)
        self.positions = positions[:, -1]  # (N,)
        if u == n:
            rope = self.lean.rope(positions)  # (N, 1, P, D)
            return self._forward(ids, rope, prompt_mask_4d(attention_mask), None)
        u_ids, u_mask = unique[:, :p], unique[:, p:]  # (U, P)
        rope = self.lean.rope((u_mask.cumsum(1) - 1).clamp(min=0))  # (U, 1, P, D)
        logits = self._forward(u_ids, rope, prompt_mask_4d(u_mask), None, group)  # (U, V)
        return logits[group]  # (N, V)

    def resume(
        self,
        cache: list[tuple[Tensor, Tensor]],
        ids: Tensor,
        attention_mask: Tensor,
        max_new_tokens: int,
    ) -> Tensor:
        """Continue the rows' `cache` (per layer keys, values (N, Hk, C, D), as `cached`
        returns it) with the left-padded new ids (N, W); `attention_mask` (N, C + W) is 1 on
        the cached columns and new ids one attends to. Logits (N, V) of the next token."""
        (n, w), c = ids.shape, cache[0][0].shape[2]
        self.cached_from, self.rows, self.total, self.prompts = 0, None, n, []
        total = c + w + max_new_tokens
        self._empty_cache(n, total, ids.device)
        for (keys, values), (old_k, old_v) in zip(self.cache, cache, strict=True):
            keys[:, :, :c], values[:, :, :c] = old_k, old_v
        self.key_bias = torch.zeros(n, total, dtype=self.lean.dtype, device=ids.device)
        self.key_bias[:, : c + w].masked_fill_(attention_mask == 0, float("-inf"))
        cos, sin = self.lean.rope(torch.arange(total, device=ids.device).unsqueeze(0))
        self.rope_table = cos[0, 0], sin[0, 0]  # (L, D)
        self.length = c
        positions = (attention_mask.cumsum(1) - 1).clamp(min=0)[:, c:]  # (N, W)
        self.positions = positions[:, -1]  # (N,)
        # new id i attends to the cached columns and new ids up to itself; a pad to itself too
        causal = torch.ones(w, c + w, dtype=torch.bool, device=ids.device).tril(c)  # (W, C + W)
        eye = torch.zeros(w, c + w, dtype=torch.bool, device=ids.device)  # (W, C + W)
        eye[:, c:] = torch.eye(w, dtype=torch.bool, device=ids.device)
        mask = (causal & attention_mask.bool()[:, None, :]) | eye  # (N, W, C + W)
        return self._forward(ids, self.lean.rope(positions), mask.unsqueeze(1), None)

    def cached(self) -> tuple[list[tuple[Tensor, Tensor]], Tensor]:
        """The rows' keys and values so far (per layer (N, Hk, C, D)) and the mask (N, C) of
        the columns one may attend to; every row decoded (no shared prompts, none retired)."""
        if self.prompts or self.rows is not None:
            raise ValueError("a cache with shared prompts or retired rows cannot be continued")
        kv = [(k[:, :, : self.length], v[:, :, : self.length]) for k, v in self.cache]
        return kv, (self.key_bias[:, : self.length] == 0).long()

    def _empty_cache(self, n: int, length: int, device: torch.device) -> None:
        """Zeroed keys and values (N, Hk, length, D) for every layer."""
        shape = (n, self.lean.kv_heads, length, self.lean.head_dim)
        new = [
            torch.zeros(shape, dtype=self.lean.dtype, device=device)
            for _ in range(2 * len(self.lean.layers))
        ]
        self.cache = list(zip(new[::2], new[1::2], strict=True))

    def retire(self, keep: Tensor) -> None:
        """Decode on only the rows `keep` (A,) (indices into the rows decoded so far): their
        cache rows, key masks and positions are copied out, the others' dropped."""
        self.cache = [(k.index_select(0, keep), v.index_select(0, keep)) for k, v in self.cache]
        self.key_bias, self.positions = self.key_bias.index_select(0, keep), self.positions[keep]
        self.rows = keep if self.rows is None else self.rows[keep]

    def step(self, tokens: Tensor) -> Tensor:
        """Feed one token (A,) to each row still decoded; logits (A, V) of the next."""
        self.positions = self.positions + 1  # (A,)
        n, d = tokens.shape[0], self.lean.head_dim
        cos, sin = (t[self.positions].view(n, 1, 1, d) for t in self.rope_table)  # (N, 1, 1, D)
        mask = self.key_bias[:, None, None, : self.length + 1]  # (N, 1, 1, L)
        return self._forward(tokens.unsqueeze(1), (cos, sin), mask, self.tape)
