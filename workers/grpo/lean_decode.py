"""The decode loop's model: prefill and one-token steps with a static KV cache (sampling).

A static KV cache filled in place, RoPE on q and k in one go, and q/k/v and gate/up each one
fused matmul (weights concatenated once per `generate` call; on a CPU without packing, small
models only). For small models the op count, not the FLOPs, sets the decode time. On CPU in
fp32 the decode weights are also packed once per call into oneDNN's blocked layout: a few-row
product then streams the weights instead of re-packing them on every call (25M model, 16 rows:
17.5 -> 6.1 ms per token for all its matmuls). The packed copy lives only while the batch
decodes. The prefill runs each distinct prompt once (GRPO repeats each G times) and copies its
keys and values to its group's cache rows. The maths is `lean.LeanModel`'s.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from workers.grpo.lean import LeanModel, Tape, onednn_matmul, prompt_mask_4d, supported

FUSE_MAX_BYTES_CPU = 32 * 2**20  # unpacked fused weight copies allowed on CPU (count in RSS)


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
        weight = model.model.embed_tokens.weight
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
        x = F.embedding(ids, lean.embed)  # (B, S, E)
        cos, sin = rope
        for i, (keys, values) in enumerate(self.cache):
            q, k, v = lean.qkv(x, i, cos, sin, tape)  # (B, H|Hk, S, D)
            if group is None:
                keys[:, :, start:end], values[:, :, start:end] = k, v
                k, v = keys[:, :, :end], values[:, :, :end]  # (N, Hk, L, D)
            else:  # start is 0: the new keys are all there is to attend to
                keys[:, :, start:end], values[:, :, start:end] = k[group], v[group]
            o = lean.attend(q, k, v, mask, i, tape)  # (B, S, E)
            x = x + o
            x = x + lean.mlp(x, i, tape)  # (B, S, E)
        self.length = end
        return lean.head(x[:, -1])  # (B, V)

    def prefill(self, ids: Tensor, attention_mask: Tensor, max_new_tokens: int) -> Tensor:
        """Run the left-padded prompts (N, P); logits (N, V) of the first new token.

        Each distinct prompt (GRPO repeats each G times, consecutively) runs through the
        layers once; its keys and values are copied to the cache rows of its group."""
        n, p = ids.shape
        shape = (n, self.lean.kv_heads, p + max_new_tokens, self.lean.head_dim)
        new = [
            ids.new_zeros(shape, dtype=self.lean.dtype) for _ in range(2 * len(self.lean.layers))
        ]
        self.cache = list(zip(new[::2], new[1::2], strict=True))
        # Per step, few ops: an additive key mask (0 or -inf) and RoPE looked up from a table.
        self.key_bias = torch.zeros(n, p + max_new_tokens, dtype=self.lean.dtype, device=ids.device)
        self.key_bias[:, :p].masked_fill_(attention_mask == 0, float("-inf"))
        table = torch.arange(p + max_new_tokens, device=ids.device).unsqueeze(0)  # (1, L)
        cos, sin = self.lean.rope(table)  # (1, 1, L, D)
        self.rope_table = cos[0, 0], sin[0, 0]  # (L, D)
        self.length = 0
        positions = (attention_mask.cumsum(1) - 1).clamp(min=0)  # (N, P)
        self.positions = positions[:, -1]  # (N,)
        rows = torch.cat([ids, attention_mask.to(ids.dtype)], 1)  # (N, 2P)
        unique, group = torch.unique_consecutive(rows, dim=0, return_inverse=True)  # (U, 2P)
        if unique.shape[0] == n:
            rope = self.lean.rope(positions)  # (N, 1, P, D)
            return self._forward(ids, rope, prompt_mask_4d(attention_mask), None)
        u_ids, u_mask = unique[:, :p], unique[:, p:]  # (U, P)
        rope = self.lean.rope((u_mask.cumsum(1) - 1).clamp(min=0))  # (U, 1, P, D)
        logits = self._forward(u_ids, rope, prompt_mask_4d(u_mask), None, group)  # (U, V)
        return logits[group]  # (N, V)

    def step(self, tokens: Tensor) -> Tensor:
        """Feed one token per row (N,); logits (N, V) of the next."""
        self.positions = self.positions + 1  # (N,)
        n, d = tokens.shape[0], self.lean.head_dim
        cos, sin = (t[self.positions].view(n, 1, 1, d) for t in self.rope_table)  # (N, 1, 1, D)
        mask = self.key_bias[:, None, None, : self.length + 1]  # (N, 1, 1, L)
        return self._forward(tokens.unsqueeze(1), (cos, sin), mask, self.tape)
