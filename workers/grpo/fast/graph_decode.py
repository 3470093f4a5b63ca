"""Decode steps with fixed shapes, replayed as one CUDA graph (the fast engine on a GPU).

On a GPU a small model's decode step is bound by kernel launches, not by memory bandwidth: one
token per row through every layer is hundreds of small kernels, each launched from Python.
`StaticStep` runs `lean_decode.LeanDecoder`'s step with shapes that never change (every row,
attention over the whole KV cache with the columns not yet written masked, the write column
and the positions kept on the device), so that CUDA can capture it once per batch and replay
it: one launch a token. The maths is the decoder's; masked columns weigh exactly 0.

Not used (the decoder's own steps run instead) with a LoRA applied in factored form, a
recorded decode (`replay.DecodeRecord`), a kept cache (episodes) or shared prompts (CPU only).
`GRPO_CUDA_GRAPHS=0` turns it off. On a CPU `StaticStep(capture=False)` runs the same
fixed-shape step eagerly (the tests pin it to the decoder's steps there).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workers.grpo.fast.lean import attention
from workers.grpo.fast.lean_decode import LeanDecoder

WARMUP_STEPS = 2  # eager steps on a side stream before the capture (cuBLAS and allocator setup)


def graphs_enabled(device: torch.device) -> bool:
    """Whether decode steps on `device` are captured as CUDA graphs (`GRPO_CUDA_GRAPHS`, on)."""
    return device.type == "cuda" and os.environ.get("GRPO_CUDA_GRAPHS", "1") != "0"


def applies(decoder: LeanDecoder) -> bool:
    """Whether `StaticStep` computes this decoder's steps: a plain LM head (its weight cast
    once), every linear map merged (no factored LoRA), no shared prompts, every row decoded."""
    lean, head = decoder.lean, decoder.lean.model.lm_head
    plain = type(head) is nn.Linear and not (head._forward_hooks or head._forward_pre_hooks)
    factored = any(layer.updates for layer in lean.layers)
    return plain and not factored and not decoder.prompts and decoder.rows is None


class StaticStep:
    """`LeanDecoder.step` after its prefill, with fixed shapes; with `capture`, one CUDA graph.

    Owns the decoder's cache from here on: its `length` and `positions` are no longer updated.
    """

    def __init__(self, decoder: LeanDecoder, capture: bool) -> None:
        self.decoder = decoder
        lean = decoder.lean
        device = decoder.key_bias.device
        n, columns = decoder.key_bias.shape
        head = lean.model.lm_head
        self.head = (
            head.weight.to(lean.dtype),
            None if head.bias is None else head.bias.to(lean.dtype),
        )
        self.tokens = torch.zeros(n, dtype=torch.long, device=device)  # (N,) fed this step
        self.positions = decoder.positions.clone()  # (N,) position of the last token fed
        self.column = torch.tensor([decoder.length], device=device)  # (1,) cache column to write
        self.columns = torch.arange(columns, device=device)  # (L,)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits = torch.zeros(0)
        if capture:
            self._capture()

    def _compute(self) -> Tensor:
        """One step: the tokens in `self.tokens` fed at the next position; logits (N, V)."""
        decoder, lean = self.decoder, self.decoder.lean
        self.positions.add_(1)
        n, d = self.tokens.shape[0], lean.head_dim
        cos, sin = (t.index_select(0, self.positions).view(n, 1, 1, d) for t in decoder.rope_table)
        written = self.columns <= self.column  # (L,) the columns written, this one included
        bias = decoder.key_bias.masked_fill(~written, float("-inf"))[:, None, None, :]  # (N,1,1,L)
        x = lean.embedding(self.tokens.unsqueeze(1))  # (N, 1, E)
        for i, (keys, values) in enumerate(decoder.cache):
            q, k, v = lean.qkv(x, i, cos, sin)  # (N, H|Hk, 1, D)
            keys.index_copy_(2, self.column, k)
            values.index_copy_(2, self.column, v)
            o = attention(q, keys, values, bias)  # (N, 1, E)
            x = x + lean.linear_map(o, i, "out", None)
            x = x + lean.mlp(x, i)
        self.column.add_(1)
        return F.linear(lean.head_input(x[:, -1]), *self.head)  # (N, V)

    def _capture(self) -> None:
        """Warm up on a side stream, put the state back, capture one step."""
        saved = self.positions.clone(), self.column.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self._compute()  # writes columns the real steps write again
        torch.cuda.current_stream().wait_stream(side)
        self.positions.copy_(saved[0])
        self.column.copy_(saved[1])
        self.graph = torch.cuda.CUDAGraph()
        # autocast's cast cache would keep tensors made during the capture: off inside it
        autocast = torch.is_autocast_enabled("cuda")
        dtype = torch.get_autocast_dtype("cuda")
        with (
            torch.autocast("cuda", dtype=dtype, enabled=autocast, cache_enabled=False),
            # thread_local: the trainer's thread goes on launching while the generator's captures
            torch.cuda.graph(self.graph, capture_error_mode="thread_local"),
        ):
            self.logits = self._compute()

    def step(self, tokens: Tensor) -> Tensor:
        """Feed one token (N,) to every row; logits (N, V) of the next (valid until the next
        step: the graph's output buffer)."""
        self.tokens.copy_(tokens)
        if self.graph is None:
            return self._compute()
        self.graph.replay()
        return self.logits
