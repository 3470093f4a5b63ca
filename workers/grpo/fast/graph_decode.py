"""Decode steps with fixed shapes, replayed as one CUDA graph (the fast engine on a GPU).

On a GPU a small model's decode step is bound by kernel launches, not by memory bandwidth: one
token per row through every layer is hundreds of small kernels, each launched from Python.
`StaticStep` runs `lean_decode.LeanDecoder`'s step with shapes that never change (every row,
attention over the whole KV cache with the columns not yet written masked, the write column
and the positions kept on the device), so that CUDA can capture it once per batch and replay
it: one launch a token. The maths is the decoder's; masked columns weigh exactly 0.

With a graph, each decoder layer is also `torch.compile`d (inductor): what is left of a
captured step's time is its count of small kernels (norms, RoPE, casts, adds), which inductor
fuses; the matrix products and attention stay cuBLAS's and SDPA's. One compiled function
(`decode_layer`, the layer's weights its arguments) serves every layer. `GRPO_COMPILE_DECODE=0`
turns that off; where compiling fails the eager layer runs, with a warning.

Not used (the decoder's own steps run instead) with a LoRA applied in factored form, a
recorded decode (`replay.DecodeRecord`), a kept cache (episodes) or shared prompts (CPU only).
`GRPO_CUDA_GRAPHS=0` turns it off. On a CPU `StaticStep(capture=False)` runs the same
fixed-shape step eagerly (the tests pin it to the decoder's steps there, compiled or not).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workers.grpo.fast.lean import Linear, Norm, apply_linear, attention, heads_of, rms, swiglu
from workers.grpo.fast.lean_decode import LeanDecoder

WARMUP_STEPS = 2  # eager steps on a side stream before the capture (cuBLAS and allocator setup)


def graphs_enabled(device: torch.device) -> bool:
    """Whether decode steps on `device` are captured as CUDA graphs (`GRPO_CUDA_GRAPHS`, on)."""
    return device.type == "cuda" and os.environ.get("GRPO_CUDA_GRAPHS", "1") != "0"


def compile_enabled(device: torch.device) -> bool:
    """Whether the captured steps' layers are compiled (`GRPO_COMPILE_DECODE`, on; GPU only:
    on a CPU nothing is captured and a compile costs more than a short decode saves)."""
    return device.type == "cuda" and os.environ.get("GRPO_COMPILE_DECODE", "1") != "0"


# A layer's weights as `decode_layer` takes them: norm1, qkv, q_norm, k_norm, out, norm2,
# gate_up, down (`lean._Layer`'s, merged and fused: one (weight, bias) per map)
LayerWeights = tuple[Norm, Linear, Norm | None, Norm | None, Linear, Norm, Linear, Linear]


def decode_layer(
    x: Tensor,
    cache: tuple[Tensor, Tensor],
    column: Tensor,
    rope: tuple[Tensor, Tensor],
    bias: Tensor,
    weights: LayerWeights,
    heads: tuple[int, int],
) -> Tensor:
    """A decoder layer's output (N, 1, E) for one new position per row, x (N, 1, E), its key
    and value written at `column` (1,) of the layer's cache (N, Hk, L, D); `rope` = cos, sin
    (N, 1, 1, D), `bias` (N, 1, 1, L) 0 or -inf. `lean.LeanModel.qkv` / `mlp`'s maths."""
    norm1, qkv, q_norm, k_norm, out, norm2, gate_up, down = weights
    keys, values = cache
    n, s, _ = x.shape
    fused = apply_linear(rms(x, norm1), qkv).view(n, s, heads[0] + 2 * heads[1], -1)
    q, k, v = heads_of(fused, heads, q_norm, k_norm, *rope)
    keys.index_copy_(2, column, k)
    values.index_copy_(2, column, v)
    x = x + apply_linear(attention(q, keys, values, bias), out)
    return x + apply_linear(swiglu(apply_linear(rms(x, norm2), gate_up)), down)


def _weights(layer: Any) -> LayerWeights:
    return (layer.norm1, layer.qkv, layer.q_norm, layer.k_norm, layer.out, layer.norm2,
            layer.gate_up, layer.down)  # fmt: skip


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
    `compiled`: each layer through `torch.compile` (None: `compile_enabled`, with `capture`).
    """

    def __init__(self, decoder: LeanDecoder, capture: bool, compiled: bool | None = None) -> None:
        self.decoder = decoder
        lean = decoder.lean
        self.weights = [_weights(layer) for layer in lean.layers]
        self.heads = lean.heads, lean.kv_heads
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
        if compiled is None:
            compiled = capture and compile_enabled(device)
        self.layer = _compiled_layer() if compiled else decode_layer
        if compiled and not capture:  # compiled now, or the eager layer (as `_capture` does)
            self._compile_or_fall_back()
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
        for cache, weights in zip(decoder.cache, self.weights, strict=True):
            x = self.layer(x, cache, self.column, (cos, sin), bias, weights, self.heads)
        self.column.add_(1)
        return F.linear(lean.head_input(x[:, -1]), *self.head)  # (N, V)

    def _compile_or_fall_back(self) -> None:
        """One step through the compiled layer (inductor compiles it here, at its first call,
        or reuses an earlier compile of these shapes); where that fails, the eager layer."""
        with self._state_kept():
            try:
                self._compute()
            except Exception as exc:  # noqa: BLE001 (inductor or its compiler missing, an op)
                warnings.warn(f"decode layers not compiled: {exc}", stacklevel=4)
                self.layer = decode_layer

    @contextlib.contextmanager
    def _state_kept(self) -> Iterator[None]:
        """Steps run inside leave the step's position and cache column as they found them
        (the columns they wrote are written again by the real steps)."""
        saved = self.positions.clone(), self.column.clone()
        yield
        self.positions.copy_(saved[0])
        self.column.copy_(saved[1])

    def _capture(self) -> None:
        """Warm up on a side stream, put the state back, capture one step. Autocast's cast
        cache would keep tensors made during the capture: off for it, and for the warm-up
        (a compiled layer is compiled for that state: the capture then replays it)."""
        autocast = torch.is_autocast_enabled("cuda")
        dtype = torch.get_autocast_dtype("cuda")
        with torch.autocast("cuda", dtype=dtype, enabled=autocast, cache_enabled=False):
            side = torch.cuda.Stream()
            with self._state_kept():
                side.wait_stream(torch.cuda.current_stream())  # after the state's copy
                with torch.cuda.stream(side):
                    if self.layer is not decode_layer:
                        self._compile_or_fall_back()
                    for _ in range(WARMUP_STEPS):
                        self._compute()
                torch.cuda.current_stream().wait_stream(side)  # then the state is put back
            self.graph = torch.cuda.CUDAGraph()
            # thread_local: the trainer's thread goes on launching while the generator's captures
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.logits = self._compute()

    def step(self, tokens: Tensor) -> Tensor:
        """Feed one token (N,) to every row; logits (N, V) of the next (valid until the next
        step: the graph's output buffer)."""
        self.tokens.copy_(tokens)
        if self.graph is None:
            return self._compute()
        self.graph.replay()
        return self.logits


BACKEND = "inductor"  # torch.compile's backend for `decode_layer`
_COMPILED: dict[str, Any] = {}


def _compiled_layer() -> Any:
    """`decode_layer` through `torch.compile`, made once per process (its compiled graphs are
    cached by shape; a second shape of a dimension makes it dynamic there, not a new graph
    per batch)."""
    if BACKEND not in _COMPILED:
        _COMPILED[BACKEND] = torch.compile(decode_layer, fullgraph=True, backend=BACKEND)
    return _COMPILED[BACKEND]
