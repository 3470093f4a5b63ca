"""A lean forward for sampling from Llama-family models (Llama, Mistral, Qwen2, Qwen3).

The same maths as the transformers forward of these models (pre-norm decoder layers: RMSNorm,
rotary self-attention with grouped KV heads, SwiGLU MLP; Qwen3's per-head q/k norms) written
with as few ops per token as possible, because for small models the op count, not the FLOPs,
sets the decode time: q, k, v and gate, up are each one fused matmul (the weights concatenated
once per `generate` call), RoPE is applied to q and k in one go, and the KV cache is a static
buffer filled in place. The LM head is called as the model's own module (forward hooks apply).

`LeanDecoder.build(model, total_length)` returns None for anything else (peft-wrapped models,
other architectures, dynamic RoPE, a sliding window shorter than the sequence), and the caller
falls back to the model's own forward. Left out: attention dropout (sampling runs in eval
mode), tensor-parallel weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_ARCHITECTURES = {"llama", "mistral", "qwen2", "qwen3"}
_STATIC_ROPE = {"default", "linear", "llama3", "yarn"}
FUSE_MAX_BYTES_CPU = 32 * 2**20


@dataclass
class _Layer:
    norm1: tuple[Tensor, float]  # RMSNorm weight, eps
    qkv: Linear  # (H + 2 Hkv) * D outputs
    q_norm: tuple[Tensor, float] | None  # Qwen3: RMSNorm over the head dim
    k_norm: tuple[Tensor, float] | None
    out: Linear
    norm2: tuple[Tensor, float]
    gate_up: Linear  # 2 * I outputs
    down: Linear


def _norm(module: Any) -> tuple[Tensor, float]:
    return module.weight, module.variance_epsilon


Linear = list[tuple[Tensor, Tensor | None]]  # maps of the same input, outputs concatenated


def _linear(dtype: torch.dtype, fuse: bool, *modules: nn.Linear) -> Linear:
    """Weights and biases in `dtype` (no copy when already so); several maps as one if `fuse`."""
    maps = [(m.weight.to(dtype), None if m.bias is None else m.bias.to(dtype)) for m in modules]
    if not fuse or len(maps) == 1:
        return maps
    zeros = [w.new_zeros(w.shape[0]) for w, _ in maps]
    bias = [z if b is None else b for (_, b), z in zip(maps, zeros, strict=True)]
    fused_bias = None if all(b is None for _, b in maps) else torch.cat(bias)
    return [(torch.cat([w for w, _ in maps]), fused_bias)]


def _apply(x: Tensor, maps: Linear) -> Tensor:
    if len(maps) == 1:
        return F.linear(x, *maps[0])
    return torch.cat([F.linear(x, w, b) for w, b in maps], -1)


def _rms(x: Tensor, norm: tuple[Tensor, float]) -> Tensor:
    """HF's RMSNorm: normalise in fp32, cast back, scale."""
    weight, eps = norm
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _supported(model: Any, total_length: int) -> bool:
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
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


class LeanDecoder:
    """Prefill and one-token decode steps with a static KV cache, for one batch."""

    @classmethod
    def build(cls, model: Any, total_length: int, fuse: bool | None = None) -> LeanDecoder | None:
        return cls(model, fuse) if _supported(model, total_length) else None

    def __init__(self, model: Any, fuse: bool | None = None) -> None:
        inner, config = model.model, model.config
        self.model = model
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.embed = inner.embed_tokens.weight
        self.final_norm = _norm(inner.norm)
        self.inv_freq = inner.rotary_emb.inv_freq.float()
        self.rope_scale = float(getattr(inner.rotary_emb, "attention_scaling", 1.0))
        # Matmuls run in the autocast dtype when autocast is on (weights cast once, here).
        device = self.embed.device.type
        autocast = torch.is_autocast_enabled(device)
        self.dtype = torch.get_autocast_dtype(device) if autocast else self.embed.dtype
        if fuse is None:  # on CPU the fused copies count against memory: small models only
            fused_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) * 0.7
            fuse = device != "cpu" or fused_bytes <= FUSE_MAX_BYTES_CPU
        with torch.no_grad():
            self.layers = [self._layer(layer, self.dtype, fuse) for layer in inner.layers]
        self.cache_k: list[Tensor] = []
        self.cache_v: list[Tensor] = []
        self.key_mask: Tensor | None = None  # (N, L) bool: keys a query may attend to
        self.length = 0

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

    def _rope(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos, sin (N, 1, S, D) for positions (N, S)."""
        freqs = positions.unsqueeze(-1).float() * self.inv_freq  # (N, S, D/2)
        emb = torch.cat((freqs, freqs), -1)  # (N, S, D)
        cos, sin = emb.cos() * self.rope_scale, emb.sin() * self.rope_scale
        return cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)

    def _attention(self, x: Tensor, i: int, cos: Tensor, sin: Tensor, mask: Tensor) -> Tensor:
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
        q, k = qk[:, :h], qk[:, h:]  # (N, H, S, D), (N, Hk, S, D)
        end = self.length + s
        self.cache_k[i][:, :, self.length : end] = k
        self.cache_v[i][:, :, self.length : end] = v
        keys, values = self.cache_k[i][:, :, :end], self.cache_v[i][:, :, :end]  # (N, Hk, L, D)
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=hk != h)
        o = o.transpose(1, 2).reshape(n, s, h * d)  # (N, S, H * D)
        return _apply(o, lay.out)  # (N, S, E)

    def _forward(self, ids: Tensor, positions: Tensor, mask: Tensor) -> Tensor:
        """Logits (N, V) of the last position; appends the S new positions to the cache."""
        x = F.embedding(ids, self.embed)  # (N, S, E)
        cos, sin = self._rope(positions, self.dtype)  # (N, 1, S, D)
        for i, lay in enumerate(self.layers):
            x = x + self._attention(x, i, cos, sin, mask)  # (N, S, E)
            gate, up = _apply(_rms(x, lay.norm2), lay.gate_up).chunk(2, -1)  # (N, S, I) x2
            x = x + _apply(F.silu(gate) * up, lay.down)  # (N, S, E)
        self.length += ids.shape[1]
        return self.model.lm_head(_rms(x[:, -1], self.final_norm))  # (N, V)

    def prefill(self, ids: Tensor, attention_mask: Tensor, max_new_tokens: int) -> Tensor:
        """Run the left-padded prompts (N, P); logits (N, V) of the first new token."""
        n, p = ids.shape
        total = p + max_new_tokens
        shape = (n, self.kv_heads, total, self.head_dim)
        self.cache_k = [ids.new_zeros(shape, dtype=self.dtype) for _ in self.layers]
        self.cache_v = [ids.new_zeros(shape, dtype=self.dtype) for _ in self.layers]
        self.key_mask = torch.ones(n, total, dtype=torch.bool, device=ids.device)  # (N, L)
        self.key_mask[:, :p] = attention_mask.bool()
        self.length = 0
        positions = (attention_mask.cumsum(1) - 1).clamp(min=0)  # (N, P)
        causal = torch.ones(p, p, dtype=torch.bool, device=ids.device).tril()  # (P, P)
        eye = torch.eye(p, dtype=torch.bool, device=ids.device)  # a pad row attends to itself
        mask = (causal & self.key_mask[:, None, :p]) | eye  # (N, P, P)
        self.positions = positions[:, -1]  # (N,)
        return self._forward(ids, positions, mask.unsqueeze(1))

    def step(self, tokens: Tensor) -> Tensor:
        """Feed one token per row (N,); logits (N, V) of the next."""
        self.positions = self.positions + 1  # (N,)
        mask = self.key_mask[:, None, None, : self.length + 1]  # (N, 1, 1, L)
        return self._forward(tokens.unsqueeze(1), self.positions.unsqueeze(1), mask)
