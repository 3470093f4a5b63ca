"""A lean forward of Llama-family models (Llama, Mistral, Qwen2, Qwen3) for sampling and scoring.

The same maths as the transformers forward of these models (pre-norm decoder layers: RMSNorm,
rotary self-attention with grouped KV heads, SwiGLU MLP; Qwen3's per-head q/k norms) with
fewer ops and less work:

- `LeanModel`: the layers' weights as tensors (fused and packed for decoding, the parameters
  themselves for scoring and training) and one decoder layer in three calls, for the decode
  loop (`lean_decode.LeanDecoder`) and for whole sequences (`lean_forward.lean_logits`: pi_ref /
  pi_old scoring and the training forward).
- the matrix products: oneDNN's on packed weights, or per shape whichever of oneDNN and the
  BLAS this machine runs faster (`onednn_is_faster`).

Plain LoRA adapters (peft) are merged into the decode loop's weights and applied in factored
form elsewhere (`lean_lora`). `supported(model, total_length)` is False for anything else
(other architectures, dynamic RoPE, a sliding window shorter than the sequence, DoRA, LoRA
dropout at work, quantised layers); the fast backend then uses the model's own forward. The
LM head is always the model's own module (forward hooks and adapters apply).
Left out: attention dropout (sampling runs in eval mode), tensor-parallel weights.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workers.grpo.fast.lean_lora import (
    LowRank,
    factored,
    is_lora,
    is_plain_lora,
    low_rank_outputs,
    merged,
)

_ARCHITECTURES = {"llama", "mistral", "qwen2", "qwen3"}
_STATIC_ROPE = {"default", "linear", "llama3", "yarn"}

Linear = list[tuple[Tensor, Tensor | None]]  # maps of the same input, outputs concatenated
Norm = tuple[Tensor, float]  # RMSNorm weight, eps
# Computes (or records, or replays: replay.py) one linear map: (input, maps, layer, map name).
Tape = Callable[[Tensor, Linear, int, str], Tensor]


def supported(model: Any, total_length: int) -> bool:
    """Whether the lean forward computes exactly what `model` computes."""
    model = model.get_base_model() if hasattr(model, "peft_config") else model
    config, inner = getattr(model, "config", None), getattr(model, "model", None)
    if config is None or inner is None or type(inner.embed_tokens) is not nn.Embedding:
        return False
    if getattr(config, "model_type", None) not in _ARCHITECTURES or config.hidden_act != "silu":
        return False
    rotary = getattr(inner, "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", "default") not in _STATIC_ROPE:
        return False
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj]
        linears += [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
        if not all(type(m) is nn.Linear or is_plain_lora(m) for m in linears):  # e.g. quantised
            return False
        window = getattr(attn, "sliding_window", None)
        if window is not None and total_length > window:
            return False
    return True


def onednn_matmul(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether oneDNN's matmul (packed or plain weights) serves: CPU, fp32, torch built with it."""
    return device.type == "cpu" and dtype == torch.float32 and _built_with_onednn()


@functools.cache
def _built_with_onednn() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _linear(
    dtype: torch.dtype, fuse: bool, pack_rows: int | None, *modules: Any
) -> tuple[Linear, list[list[LowRank]]]:
    """Weights and biases in `dtype` (the parameters themselves when already so), and the LoRA
    updates of each map (merged in when `fuse` or `pack_rows`: then none); with `pack_rows`,
    each weight packed for products of about that many rows."""
    if fuse or pack_rows:
        pairs, updates = [merged(m) for m in modules], []
    else:
        parts = [factored(m) for m in modules]
        pairs, updates = [(w, b) for w, b, _ in parts], [u for _, _, u in parts]
        updates = updates if any(updates) else []
    maps = [(w.to(dtype), None if b is None else b.to(dtype)) for w, b in pairs]
    if fuse and len(maps) > 1:
        zeros = [w.new_zeros(w.shape[0]) for w, _ in maps]
        bias = [z if b is None else b for (_, b), z in zip(maps, zeros, strict=True)]
        fused_bias = None if all(b is None for _, b in maps) else torch.cat(bias)
        # Concatenated along the output dim; unpacked, the inputs' layout is kept (column-major
        # on CPU), packed it is row-major, the layout the packing reads without another copy.
        weights = [w for w, _ in maps] if pack_rows else [w.t() for w, _ in maps]
        fused = torch.cat(weights, 0) if pack_rows else torch.cat(weights, 1).t()
        maps = [(fused, fused_bias)]
    if pack_rows is None:
        return maps, updates
    pack = torch.ops.mkldnn._reorder_linear_weight
    return [(pack(w.contiguous(), pack_rows), b) for w, b in maps], updates


def _product(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    # Packed weights: oneDNN's matmul on its blocked layout. Without autograd (pi_ref / pi_old
    # scoring) oneDNN's matmul on the plain weight too where it is the faster of the two on this
    # machine: which one wins depends on the CPU, so it is measured (`onednn_is_faster`).
    # Compiled (`graph_decode.decode_layer`), the compiler chooses.
    if weight.is_mkldnn or (
        not torch.compiler.is_compiling()
        and torch.is_inference_mode_enabled()
        and onednn_matmul(weight.device, weight.dtype)
        and onednn_is_faster(_row_bucket(x.numel() // x.shape[-1]), *weight.shape)
    ):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def _row_bucket(rows: int) -> int:
    return max(64, 1 << (rows - 1).bit_length())  # the next power of two


@functools.cache
def onednn_is_faster(rows: int, out_features: int, in_features: int) -> bool:
    """Whether oneDNN's matmul on a plain fp32 weight beats F.linear for this shape on this
    machine: each run 6 times, alternating; the best of runs 2-6 compared (once per process
    and shape)."""
    own = torch.Generator().manual_seed(0)  # the global RNG stays untouched (exact resume)
    x = torch.randn(rows, in_features, generator=own)
    weight = torch.randn(out_features, in_features, generator=own)
    candidates = {
        "onednn": lambda: torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], ""),
        "blas": lambda: F.linear(x, weight),
    }
    seconds: dict[str, list[float]] = {name: [] for name in candidates}
    with torch.inference_mode():
        for _ in range(6):
            for name, run in candidates.items():
                start = time.perf_counter()
                run()
                seconds[name].append(time.perf_counter() - start)
    return min(seconds["onednn"][1:]) < min(seconds["blas"][1:])


def apply_linear(x: Tensor, maps: Linear) -> Tensor:
    """x mapped by each (weight, bias) of `maps`, outputs concatenated along the last dim."""
    if len(maps) == 1:
        return _product(x, *maps[0])
    return torch.cat([_product(x, w, b) for w, b in maps], -1)


def _rope(x: Tensor, cos: Tensor, sin: Tensor, sign: float = 1.0) -> Tensor:
    """x cos + sign rotate_half(x) sin, rotate_half(x) = (-x2, x1), by halves in place: three
    ops and no rotated copy (a cat of half slices costs far more at training sizes)."""
    half = x.shape[-1] // 2
    y = x * cos
    y[..., :half].addcmul_(x[..., half:], sin[..., :half], value=-sign)
    y[..., half:].addcmul_(x[..., :half], sin[..., half:], value=sign)
    return y


class _Rotate(torch.autograd.Function):
    """RoPE with its backward written out, dx = g cos + rotate_half^T(g sin) = the rotation by
    -sin (cos, sin have equal halves); autograd's own, through slices, zero-fills a full-size
    grad per half."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        ctx.save_for_backward(cos, sin)
        return _rope(x, cos, sin)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        return _rope(grad, cos, sin, sign=-1.0), None, None


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding of x (N, H, S, D) by cos, sin (broadcasting to it; no grad), as HF's
    x cos + rotate_half(x) sin."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _Rotate.apply(x, cos, sin)
    return _rope(x, cos, sin)


@functools.cache
def _scalar(value: float, device: torch.device) -> Tensor:
    """A 0-d fp32 tensor of `value` on `device`, made once."""
    with torch.inference_mode(False):  # a normal tensor: autograd may see it
        return torch.tensor(value, device=device)


def rms(x: Tensor, norm: Norm) -> Tensor:
    """HF's RMSNorm: normalise in fp32, cast back, scale."""
    if x.device.type != "cpu" or torch.compiler.is_compiling():  # compiled: inductor fuses it
        return fused_rms(x, norm)
    weight, eps = norm
    fp32 = x.dtype == torch.float32 and weight.dtype == torch.float32
    if fp32 and not torch.is_autocast_enabled(x.device.type):  # autocast would run vecdot in bf16
        # Five ops where F.rms_norm runs eight on CPU (decode steps pay per op, not per byte)
        squares = torch.linalg.vecdot(x, x).unsqueeze(-1)  # (..., 1) sum of x^2
        inverse = torch.add(_scalar(eps, x.device), squares, alpha=1.0 / x.shape[-1]).rsqrt()
        return x * inverse * weight
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def fused_rms(x: Tensor, norm: Norm) -> Tensor:
    """HF's RMSNorm through torch's fused kernel (on a GPU, where a decode step pays per kernel:
    one or two instead of five to eight): an fp32 input normalised and scaled at once; a half
    precision one normalised in fp32 and rounded to its dtype by the kernel, then scaled in that
    dtype, in HF's order."""
    weight, eps = norm
    shape = (x.shape[-1],)
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, shape, weight, eps)
    return weight * F.rms_norm(x, shape, None, eps)


@dataclass
class _Layer:
    norm1: Norm
    qkv: Linear  # (H + 2 Hk) * D outputs
    q_norm: Norm | None  # Qwen3: RMSNorm over the head dim
    k_norm: Norm | None
    out: Linear
    norm2: Norm
    gate_up: Linear  # 2 * I outputs
    down: Linear
    updates: dict[str, list[list[LowRank]]]  # LoRA, factored: map name -> each map's updates


def _norm(module: Any) -> Norm:
    return module.weight, module.variance_epsilon


class LeanModel:
    """The model's layers as tensors; one decoder layer in three calls: qkv, attention, mlp.

    With `pack_rows` (inference only: packed weights have no autograd) the linear weights are
    packed, the LM head's too when it is a plain `nn.Linear` without hooks.
    """

    def __init__(
        self, model: Any, fuse: bool, dtype: torch.dtype, pack_rows: int | None = None
    ) -> None:
        model = model.get_base_model() if hasattr(model, "peft_config") else model
        inner, config = model.model, model.config
        self.model, self.dtype = model, dtype
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.embed = inner.embed_tokens.weight
        # nn.Embedding's padding_idx: that row gets no gradient (HF sets it to the pad token)
        self.padding_idx = inner.embed_tokens.padding_idx
        self.final_norm = _norm(inner.norm)
        self.inv_freq = inner.rotary_emb.inv_freq.float()
        self.rope_scale = float(getattr(inner.rotary_emb, "attention_scaling", 1.0))
        self.layers = [self._layer(layer, dtype, fuse, pack_rows) for layer in inner.layers]
        head = model.lm_head
        plain = type(head) is nn.Linear and not (head._forward_hooks or head._forward_pre_hooks)
        self.packed_head = (
            _linear(dtype, False, pack_rows, head)[0] if pack_rows and plain else None
        )
        adapted = any(is_lora(m) for m in model.modules())
        self.lora_merged = adapted and (fuse or pack_rows is not None)  # as `_linear` decides

    @staticmethod
    def _layer(layer: Any, dtype: torch.dtype, fuse: bool, pack_rows: int | None) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        modules = {
            "qkv": (attn.q_proj, attn.k_proj, attn.v_proj),
            "out": (attn.o_proj,),
            "gate_up": (mlp.gate_proj, mlp.up_proj),
            "down": (mlp.down_proj,),
        }
        maps = {name: _linear(dtype, fuse, pack_rows, *ms) for name, ms in modules.items()}
        return _Layer(
            norm1=_norm(layer.input_layernorm),
            qkv=maps["qkv"][0],
            q_norm=_norm(q_norm) if q_norm is not None else None,
            k_norm=_norm(k_norm) if k_norm is not None else None,
            out=maps["out"][0],
            norm2=_norm(layer.post_attention_layernorm),
            gate_up=maps["gate_up"][0],
            down=maps["down"][0],
            updates={name: updates for name, (_, updates) in maps.items() if updates},
        )

    def embedding(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.embed, self.padding_idx)

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin (N, 1, S, D) for positions (N, S)."""
        freqs = positions.unsqueeze(-1).float() * self.inv_freq  # (N, S, D/2)
        emb = torch.cat((freqs, freqs), -1)  # (N, S, D)
        cos, sin = emb.cos() * self.rope_scale, emb.sin() * self.rope_scale
        return cos.to(self.dtype).unsqueeze(1), sin.to(self.dtype).unsqueeze(1)

    def linear_map(self, x: Tensor, i: int, name: str, tape: Tape | None) -> Tensor:
        """Layer i's linear map `name` (qkv, out, gate_up, down) of x; through `tape` if given."""
        maps = getattr(self.layers[i], name)
        y = apply_linear(x, maps) if tape is None else tape(x, maps, i, name)
        updates = self.layers[i].updates.get(name)
        if updates is None:
            return y
        low = low_rank_outputs(x, updates, [w.shape[0] for w, _ in maps])
        out = y + low
        # Replayed rows (the last ones) recorded with the update merged in: only its gradient
        # is added there.
        k = getattr(tape, "merged_rows", 0)
        if k:
            out[..., -k:, :] -= low.detach()[..., -k:, :]
        return out

    def qkv(
        self, x: Tensor, i: int, cos: Tensor, sin: Tensor, tape: Tape | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Rotated queries (N, H, S, D), keys (N, Hk, S, D) and values of layer i's input x."""
        n, s, _ = x.shape
        h, hk, d, lay = self.heads, self.kv_heads, self.head_dim, self.layers[i]
        qkv = self.linear_map(rms(x, lay.norm1), i, "qkv", tape).view(n, s, h + 2 * hk, d)
        return heads_of(qkv, (h, hk), lay.q_norm, lay.k_norm, cos, sin)

    def mlp(self, x: Tensor, i: int, tape: Tape | None = None) -> Tensor:
        gate_up = self.linear_map(rms(x, self.layers[i].norm2), i, "gate_up", tape)  # (N, S, 2I)
        return self.linear_map(swiglu(gate_up), i, "down", tape)  # (N, S, E)

    def head_input(self, x: Tensor) -> Tensor:
        """The final norm of the last layer's output: what the LM head maps."""
        return rms(x, self.final_norm)

    def head(self, x: Tensor) -> Tensor:
        x = self.head_input(x)
        if self.packed_head is not None:
            return apply_linear(x, self.packed_head)  # (..., V)
        return self.model.lm_head(x)  # (..., V)


def heads_of(
    qkv: Tensor,
    heads: tuple[int, int],
    q_norm: Norm | None,
    k_norm: Norm | None,
    cos: Tensor,
    sin: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """Rotated queries (N, H, S, D), keys (N, Hk, S, D) and values of the fused q/k/v map's
    output qkv (N, S, H + 2 Hk, D); `heads` = (H, Hk); Qwen3's per-head norms where given."""
    h, hk = heads
    # split, not slices: its backward joins the three grads in one copy, where slices'
    # backward zero-fills the whole (N, S, H + 2Hk, D) grad and copies each part in
    qk, v = qkv.split([h + hk, hk], 2)  # (N, S, H + Hk, D), (N, S, Hk, D)
    if q_norm is not None and k_norm is not None:
        q, k = qk.split([h, hk], 2)
        qk = torch.cat((rms(q, q_norm), rms(k, k_norm)), 2)
    qk = rotate(qk.transpose(1, 2), cos, sin)  # (N, H + Hk, S, D)
    return qk[:, :h], qk[:, h:], v.transpose(1, 2)


def swiglu(gate_up: Tensor) -> Tensor:
    """silu(gate) * up of the fused gate/up map's output (..., 2I)."""
    gate, up = gate_up.chunk(2, -1)
    return F.silu(gate) * up


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Heads joined (N, S, H * D) of q (N, H, S, D) attending to k, v (N, Hk, L, D); mask
    (N, 1, S, L): True (or 0) = may attend."""
    n, _, s, _ = q.shape
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])
    return o.transpose(1, 2).reshape(n, s, -1)


def prompt_mask_4d(attention_mask: Tensor) -> Tensor:
    """(N, 1, P, P) causal attention over left-padded prompts; a pad row sees itself (no NaN)."""
    p = attention_mask.shape[1]
    causal = torch.ones(p, p, dtype=torch.bool, device=attention_mask.device).tril()  # (P, P)
    eye = torch.eye(p, dtype=torch.bool, device=attention_mask.device)  # (P, P)
    return ((causal & attention_mask.bool()[:, None, :]) | eye).unsqueeze(1)  # (N, 1, P, P)
