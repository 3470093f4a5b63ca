"""A lean forward of Llama-family models (Llama, Mistral, Qwen2, Qwen3) for sampling and scoring.

The same maths as the transformers forward of these models (pre-norm decoder layers: RMSNorm,
rotary self-attention with grouped KV heads, SwiGLU MLP; Qwen3's per-head q/k norms) with
fewer ops and less work:

- `LeanDecoder` (sampling): a static KV cache filled in place, RoPE on q and k in one go, and on
  small models (or any GPU) q/k/v and gate/up each one fused matmul (weights concatenated once
  per `generate` call). For small models the op count, not the FLOPs, sets the decode time.
- `lean_logprobs` (pi_ref and the policy's training forward): the G completions of a group share
  their prompt, so each distinct prompt runs through the layers once and the completions attend
  to its keys and values; a prompt of P tokens costs 1/G of what it costs in a padded batch.
  It runs on the model's own parameters, so autograd gives the exact gradient (the prompt's
  share summed over its group).

`supported(model, total_length)` is False for anything else (peft-wrapped models, other
architectures, dynamic RoPE, a sliding window shorter than the sequence); callers then use the
model's own forward. The LM head is always the model's own module (forward hooks apply).
Left out: attention dropout (sampling runs in eval mode), tensor-parallel weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_ARCHITECTURES = {"llama", "mistral", "qwen2", "qwen3"}
_STATIC_ROPE = {"default", "linear", "llama3", "yarn"}
FUSE_MAX_BYTES_CPU = 32 * 2**20  # fused weight copies allowed on CPU (they count in RSS)

Linear = list[tuple[Tensor, Tensor | None]]  # maps of the same input, outputs concatenated
Norm = tuple[Tensor, float]  # RMSNorm weight, eps


def supported(model: Any, total_length: int) -> bool:
    """Whether the lean forward computes exactly what `model` computes."""
    config, inner = getattr(model, "config", None), getattr(model, "model", None)
    if config is None or inner is None or hasattr(model, "peft_config"):
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
        if any(type(m) is not nn.Linear for m in linears):  # LoRA or quantised layers
            return False
        window = getattr(attn, "sliding_window", None)
        if window is not None and total_length > window:
            return False
    return True


def _linear(dtype: torch.dtype, fuse: bool, *modules: nn.Linear) -> Linear:
    """Weights and biases in `dtype` (the parameters themselves when already so)."""
    maps = [(m.weight.to(dtype), None if m.bias is None else m.bias.to(dtype)) for m in modules]
    if not fuse or len(maps) == 1:
        return maps
    zeros = [w.new_zeros(w.shape[0]) for w, _ in maps]
    bias = [z if b is None else b for (_, b), z in zip(maps, zeros, strict=True)]
    fused_bias = None if all(b is None for _, b in maps) else torch.cat(bias)
    # Concatenated along the output dim with the inputs' layout kept (column-major on CPU).
    return [(torch.cat([w.t() for w, _ in maps], 1).t(), fused_bias)]


def _apply(x: Tensor, maps: Linear) -> Tensor:
    if len(maps) == 1:
        return F.linear(x, *maps[0])
    return torch.cat([F.linear(x, w, b) for w, b in maps], -1)


def _rms(x: Tensor, norm: Norm) -> Tensor:
    """HF's RMSNorm: normalise in fp32, cast back, scale (one fused op for fp32 inputs)."""
    weight, eps = norm
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


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


def _norm(module: Any) -> Norm:
    return module.weight, module.variance_epsilon


class LeanModel:
    """The model's layers as tensors; one decoder layer in three calls: qkv, attention, mlp."""

    def __init__(self, model: Any, fuse: bool, dtype: torch.dtype) -> None:
        inner, config = model.model, model.config
        self.model, self.dtype = model, dtype
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.embed = inner.embed_tokens.weight
        self.final_norm = _norm(inner.norm)
        self.inv_freq = inner.rotary_emb.inv_freq.float()
        self.rope_scale = float(getattr(inner.rotary_emb, "attention_scaling", 1.0))
        self.layers = [self._layer(layer, dtype, fuse) for layer in inner.layers]

    @staticmethod
    def _layer(layer: Any, dtype: torch.dtype, fuse: bool) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        return _Layer(
            norm1=_norm(layer.input_layernorm),
            qkv=_linear(dtype, fuse, attn.q_proj, attn.k_proj, attn.v_proj),
            q_norm=_norm(q_norm) if q_norm is not None else None,
            k_norm=_norm(k_norm) if k_norm is not None else None,
            out=_linear(dtype, fuse, attn.o_proj),
            norm2=_norm(layer.post_attention_layernorm),
            gate_up=_linear(dtype, fuse, mlp.gate_proj, mlp.up_proj),
            down=_linear(dtype, fuse, mlp.down_proj),
        )

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin (N, 1, S, D) for positions (N, S)."""
        freqs = positions.unsqueeze(-1).float() * self.inv_freq  # (N, S, D/2)
        emb = torch.cat((freqs, freqs), -1)  # (N, S, D)
        cos, sin = emb.cos() * self.rope_scale, emb.sin() * self.rope_scale
        return cos.to(self.dtype).unsqueeze(1), sin.to(self.dtype).unsqueeze(1)

    def qkv(self, x: Tensor, i: int, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Rotated queries (N, H, S, D), keys (N, Hk, S, D) and values of layer i's input x."""
        n, s, _ = x.shape
        h, hk, d, lay = self.heads, self.kv_heads, self.head_dim, self.layers[i]
        qkv = _apply(_rms(x, lay.norm1), lay.qkv).view(n, s, h + 2 * hk, d)  # (N, S, H', D)
        qkv = qkv.transpose(1, 2)  # (N, H + 2Hk, S, D)
        qk, v = qkv[:, : h + hk], qkv[:, h + hk :]  # (N, H + Hk, S, D), (N, Hk, S, D)
        if lay.q_norm is not None:
            qk = torch.cat((_rms(qk[:, :h], lay.q_norm), _rms(qk[:, h:], lay.k_norm)), 1)
        half = d // 2
        rotated = torch.cat((-qk[..., half:], qk[..., :half]), -1)  # (N, H + Hk, S, D)
        qk = qk * cos + rotated * sin  # (N, H + Hk, S, D)
        return qk[:, :h], qk[:, h:], v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, i: int) -> Tensor:
        """Attention output projected back (N, S, E); mask (N, 1, S, L) True = may attend."""
        n, _, s, _ = q.shape
        o = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1]
        )
        return _apply(o.transpose(1, 2).reshape(n, s, -1), self.layers[i].out)  # (N, S, E)

    def mlp(self, x: Tensor, i: int) -> Tensor:
        lay = self.layers[i]
        gate, up = _apply(_rms(x, lay.norm2), lay.gate_up).chunk(2, -1)  # (N, S, I) x2
        return _apply(F.silu(gate) * up, lay.down)  # (N, S, E)

    def head(self, x: Tensor) -> Tensor:
        return self.model.lm_head(_rms(x, self.final_norm))  # (..., V)


def _prompt_mask(attention_mask: Tensor) -> Tensor:
    """(N, 1, P, P) causal attention over left-padded prompts; a pad row sees itself (no NaN)."""
    p = attention_mask.shape[1]
    causal = torch.ones(p, p, dtype=torch.bool, device=attention_mask.device).tril()  # (P, P)
    eye = torch.eye(p, dtype=torch.bool, device=attention_mask.device)  # (P, P)
    return ((causal & attention_mask.bool()[:, None, :]) | eye).unsqueeze(1)  # (N, 1, P, P)


class LeanDecoder:
    """Prefill and one-token decode steps with a static KV cache, for one batch."""

    @classmethod
    def build(cls, model: Any, total_length: int, fuse: bool | None = None) -> LeanDecoder | None:
        return cls(model, fuse) if supported(model, total_length) else None

    def __init__(self, model: Any, fuse: bool | None = None) -> None:
        weight = model.model.embed_tokens.weight
        device = weight.device.type
        autocast = torch.is_autocast_enabled(device)  # matmuls in its dtype, weights cast once
        dtype = torch.get_autocast_dtype(device) if autocast else weight.dtype
        if fuse is None:  # on CPU the fused copies count against memory: small models only
            fused_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) * 0.7
            fuse = device != "cpu" or fused_bytes <= FUSE_MAX_BYTES_CPU
        with torch.no_grad():
            self.lean = LeanModel(model, fuse, dtype)
        self.cache: list[tuple[Tensor, Tensor]] = []  # per layer (N, Hk, L, D) keys, values
        self.key_mask = torch.zeros(0, 0, dtype=torch.bool)  # (N, L) keys one may attend to
        self.length = 0
        self.positions = torch.zeros(0, dtype=torch.long)  # (N,) position of the last token

    def _forward(self, ids: Tensor, positions: Tensor, mask: Tensor) -> Tensor:
        """Logits (N, V) of the last position; appends the S new positions to the cache."""
        lean, start, end = self.lean, self.length, self.length + ids.shape[1]
        x = F.embedding(ids, lean.embed)  # (N, S, E)
        cos, sin = lean.rope(positions)  # (N, 1, S, D)
        for i, (keys, values) in enumerate(self.cache):
            q, k, v = lean.qkv(x, i, cos, sin)
            keys[:, :, start:end], values[:, :, start:end] = k, v
            x = x + lean.attend(q, keys[:, :, :end], values[:, :, :end], mask, i)  # (N, S, E)
            x = x + lean.mlp(x, i)  # (N, S, E)
        self.length = end
        return lean.head(x[:, -1])  # (N, V)

    def prefill(self, ids: Tensor, attention_mask: Tensor, max_new_tokens: int) -> Tensor:
        """Run the left-padded prompts (N, P); logits (N, V) of the first new token."""
        n, p = ids.shape
        shape = (n, self.lean.kv_heads, p + max_new_tokens, self.lean.head_dim)
        new = [
            ids.new_zeros(shape, dtype=self.lean.dtype) for _ in range(2 * len(self.lean.layers))
        ]
        self.cache = list(zip(new[::2], new[1::2], strict=True))
        self.key_mask = torch.ones(n, p + max_new_tokens, dtype=torch.bool, device=ids.device)
        self.key_mask[:, :p] = attention_mask.bool()
        self.length = 0
        positions = (attention_mask.cumsum(1) - 1).clamp(min=0)  # (N, P)
        self.positions = positions[:, -1]  # (N,)
        return self._forward(ids, positions, _prompt_mask(attention_mask))

    def step(self, tokens: Tensor) -> Tensor:
        """Feed one token per row (N,); logits (N, V) of the next."""
        self.positions = self.positions + 1  # (N,)
        mask = self.key_mask[:, None, None, : self.length + 1]  # (N, 1, 1, L)
        return self._forward(tokens.unsqueeze(1), self.positions.unsqueeze(1), mask)


def lean_logits(
    model: Any,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    share_prompts: bool = True,
) -> Tensor:
    """Logits (N, T, V) that predict each completion token; differentiable.

    With `share_prompts`, rows are grouped by equal consecutive (prompt ids, prompt mask), each
    distinct prompt runs once and its completions attend to its keys and values. The numbers
    are the same up to float summation order, which then depends on how rows are grouped.
    """
    n, p = prompt_ids.shape
    t = completion_ids.shape[1] - 1  # the last token predicts nothing we score: not fed
    device = prompt_ids.device
    weight = model.model.embed_tokens.weight
    autocast = torch.is_autocast_enabled(device.type)
    dtype = torch.get_autocast_dtype(device.type) if autocast else weight.dtype
    lean = LeanModel(model, fuse=False, dtype=dtype)
    rows = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], 1)  # (N, 2P)
    if share_prompts:
        unique, group = torch.unique_consecutive(rows, dim=0, return_inverse=True)  # (U, 2P), (N,)
    else:
        unique, group = rows, torch.arange(n, device=device)  # (N, 2P), (N,)
    u_ids, u_mask = unique[:, :p], unique[:, p:]  # (U, P)
    u_pos = (u_mask.cumsum(1) - 1).clamp(min=0)  # (U, P)
    c_pos = u_mask.sum(1)[group].unsqueeze(1) + torch.arange(t, device=device)  # (N, T - 1)
    p_cos, p_sin = lean.rope(u_pos)  # (U, 1, P, D)
    c_cos, c_sin = lean.rope(c_pos)  # (N, 1, T - 1, D)
    p_mask = _prompt_mask(u_mask)  # (U, 1, P, P)
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()  # (T - 1, T - 1)
    c_mask = torch.cat(  # (N, 1, T - 1, P + T - 1): the prompt's real tokens, then causal
        [u_mask.bool()[group][:, None, None, :].expand(n, 1, t, p), causal.expand(n, 1, t, t)], -1
    )
    xp = F.embedding(u_ids, lean.embed)  # (U, P, E)
    xc = F.embedding(completion_ids[:, :t], lean.embed)  # (N, T - 1, E)
    for i in range(len(lean.layers)):
        qp, kp, vp = lean.qkv(xp, i, p_cos, p_sin)  # (U, H|Hk, P, D)
        if t > 0:
            qc, kc, vc = lean.qkv(xc, i, c_cos, c_sin)  # (N, H|Hk, T - 1, D)
            keys = torch.cat([kp[group], kc], 2)  # (N, Hk, P + T - 1, D)
            values = torch.cat([vp[group], vc], 2)  # (N, Hk, P + T - 1, D)
            xc = xc + lean.attend(qc, keys, values, c_mask, i)  # (N, T - 1, E)
            xc = xc + lean.mlp(xc, i)  # (N, T - 1, E)
        if i + 1 < len(lean.layers):  # the last layer's prompt rows feed only their last token
            xp = xp + lean.attend(qp, kp, vp, p_mask, i)  # (U, P, E)
        else:
            xp = xp[:, -1:] + lean.attend(qp[:, :, -1:], kp, vp, p_mask[:, :, -1:], i)  # (U, 1, E)
        xp = xp + lean.mlp(xp, i)  # (U, P | 1, E)
    hidden = torch.cat([xp[group, -1:], xc], 1)  # (N, T, E): positions P-1 .. P+T-2
    del completion_mask  # completion keys are causal; pads after EOS only see earlier tokens
    return lean.head(hidden)  # (N, T, V)
