"""The lean forward (`workers.grpo.fast.lean`) computes what the transformers forward computes.

Checked on small random Llama (MHA), Qwen2 (GQA, q/k/v biases) and Qwen3 (per-head q/k norms)
models: decode logits step by step with left-padded prompts, and the scoring logits with their
gradient, with and without prompt sharing. Models the lean path does not cover fall back.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from tests.workers.grpo.helpers import LLAMA_FAMILY, SMALL_LM, small_lm
from workers.grpo.fast import lean, lean_decode, logprobs
from workers.grpo.fast.lean import attention, supported
from workers.grpo.fast.lean_decode import LeanDecoder, shared_prompt_attention
from workers.grpo.fast.lean_forward import fed_index, lean_logits
from workers.grpo.fast.sampling import _HFForward


def _models():
    torch.manual_seed(0)
    return {name: small_lm(name) for name in LLAMA_FAMILY}


MODELS = _models()


def _prompts(sizes: tuple[int, ...] = (3, 3), width: int = 6):
    """Left-padded prompts (N, P), each repeated `sizes[i]` times (its group)."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 64, (len(sizes), width), generator=gen)  # (B, P)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # the second prompt is left-padded
    ids = ids.masked_fill(mask == 0, 0)
    repeats = torch.tensor(sizes)
    return ids.repeat_interleave(repeats, 0), mask.repeat_interleave(repeats, 0)  # (N, P)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("pack", [True, False])
@pytest.mark.parametrize("share", [True, False])
def test_decode_logits_match_the_model(monkeypatch, name, fuse, pack, share) -> None:
    """Step by step, also with the prompts' keys and values kept once per group (`share`)."""
    monkeypatch.setattr(lean_decode, "SHARE_MIN_PROMPT_BYTES", 0 if share else 2**40)
    model = MODELS[name].eval()
    ids, mask = _prompts()
    steps = torch.randint(1, 64, (5, ids.shape[0]), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        lean, ref = LeanDecoder(model, fuse=fuse, pack=pack, rows=6), _HFForward(model)
        packed = [w.is_mkldnn for lay in lean.lean.layers for w, _ in lay.qkv + lay.down]
        assert all(packed) if pack else not any(packed)
        assert (lean.lean.packed_head is not None) == pack
        a, b = lean.prefill(ids, mask, 5), ref.prefill(ids, mask, 5)
        width = 5 if share else ids.shape[1] + 5  # the cache: completions only when shared
        assert [k.shape[0] for k, _ in lean.prompts] == [2] * len(lean.cache) * share
        assert {k.shape[2] for k, _ in lean.cache} == {width}
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        for tokens in steps:
            torch.testing.assert_close(lean.step(tokens), ref.step(tokens), atol=1e-5, rtol=0)


@pytest.mark.parametrize("sizes", [(4, 2), (1, 1, 1), (5, 1), (3, 3)])
def test_prefill_runs_each_distinct_prompt_once(monkeypatch, sizes) -> None:
    """A group's prompt goes through the layers once; every row of the group gets its keys and
    values (kept once per group where groups have one size > 1) and decodes on as with its own
    prefill."""
    monkeypatch.setattr(lean_decode, "SHARE_MIN_PROMPT_BYTES", 0)
    model = MODELS["qwen2"].eval()
    ids, mask = _prompts(sizes)
    n, p = ids.shape
    rows: list[int] = []
    spied = lean.LeanModel.linear_map

    def counting(self, x, i, name, tape):  # noqa: ANN001, ANN202
        rows.append(x.numel() // x.shape[-1])
        return spied(self, x, i, name, tape)

    monkeypatch.setattr(lean.LeanModel, "linear_map", counting)
    steps = torch.randint(1, 64, (4, n), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        decoder, ref = LeanDecoder(model, rows=n), _HFForward(model)
        a, b = decoder.prefill(ids, mask, 4), ref.prefill(ids, mask, 4)
        assert set(rows) == {len(sizes) * p}
        assert bool(decoder.prompts) == (sizes == (3, 3))
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        for tokens in steps:
            torch.testing.assert_close(decoder.step(tokens), ref.step(tokens), atol=1e-5, rtol=0)


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (6, 1)])
def test_shared_prompt_attention_is_attention_over_prompt_and_own_keys(heads, kv_heads) -> None:
    """Against attention over each row's copy of its prompt's keys then its own, with a
    padded prompt and grouped-query heads, for all rows and for some."""
    gen = torch.Generator().manual_seed(3)
    u, g, p, c, d = 2, 3, 5, 4, 8
    n = u * g
    q = torch.randn(n, heads, 1, d, generator=gen)
    prompt = [torch.randn(u, kv_heads, p, d, generator=gen) for _ in range(2)]
    own = [torch.randn(n, kv_heads, c, d, generator=gen) for _ in range(2)]
    seen = torch.ones(u, p, dtype=torch.bool)
    seen[1, :2] = False  # the second prompt is left-padded
    bias = torch.zeros(u, 1, 1, p).masked_fill(~seen[:, None, None], float("-inf"))
    keys, values = (
        torch.cat([z.repeat_interleave(g, 0), o], 2) for z, o in zip(prompt, own, strict=True)
    )
    mask = torch.cat([seen.repeat_interleave(g, 0), torch.ones(n, c, dtype=torch.bool)], 1)
    expected = attention(q, keys, values, mask[:, None, None])  # (N, 1, H D)
    got = shared_prompt_attention(q, (prompt[0], prompt[1]), bias, own[0], own[1])
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    rows = torch.tensor([0, 2, 5])  # the rows still decoded (others retired), both groups
    got = shared_prompt_attention(
        q[rows], (prompt[0], prompt[1]), bias, own[0][rows], own[1][rows], rows, n
    )
    torch.testing.assert_close(got, expected[rows], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("sizes", [(3, 3), (4, 2), (1, 1)])
@pytest.mark.parametrize("host_groups", [True, False])
def test_other_models_score_each_distinct_prompt_once(sizes, host_groups) -> None:
    """A model outside the lean forward (here: GELU MLPs) scores through its own forward: U
    prompts run once, their KV cache copied to the group's rows; log-probs and gradients are
    those of whole sequences in one forward. Groups from the host or found on the device."""
    from workers.grpo.fast.logprobs import completion_logprobs

    torch.manual_seed(0)
    model = small_lm("qwen2", hidden_act="gelu")
    assert not supported(model, 64)
    ids, mask = _prompts(sizes)
    n, p = ids.shape
    completion = torch.randint(1, 64, (n, 5), generator=torch.Generator().manual_seed(4))
    cmask = torch.ones(n, 5)
    cmask[1, 3:] = 0  # a completion that ended early
    weights = torch.linspace(-1, 1, n * 5).view(n, 5)
    shapes: list[tuple[int, ...]] = []
    hook = model.register_forward_pre_hook(
        lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    try:
        groups = [g for g, size in enumerate(sizes) for _ in range(size)] if host_groups else None
        lp, _ = completion_logprobs(model, ids, mask, completion, cmask, groups=groups)
    finally:
        hook.remove()
    shared = len(sizes) < n  # (U, P): each distinct prompt once; else whole sequences
    assert shapes[0] == ((len(sizes), p) if shared else (n, p + 5))
    (lp * weights).sum().backward()
    got = {k: q.grad.clone() for k, q in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    seq, full = torch.cat([ids, completion], 1), torch.cat([mask, cmask.long()], 1)
    pos = (full.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=seq, attention_mask=full, position_ids=pos).logits[:, p - 1 : -1]
    want = logits.log_softmax(-1).gather(-1, completion.unsqueeze(-1)).squeeze(-1) * cmask
    (want * weights).sum().backward()
    torch.testing.assert_close(lp * cmask, want.detach(), atol=1e-5, rtol=0)
    for k, q in model.named_parameters():
        torch.testing.assert_close(got[k], q.grad, atol=1e-5, rtol=1e-4, msg=k)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize(("share", "sizes"), [(True, (3, 3)), (False, (3, 3)), (True, (4, 2))])
def test_scoring_logits_and_gradient_match_the_model(name, share, sizes) -> None:
    """Groups of equal size share their prompt through an expanded view, others by index."""
    model = MODELS[name].train()
    ids, mask = _prompts(sizes)
    n, t = ids.shape[0], 7
    completion = torch.randint(1, 64, (n, t), generator=torch.Generator().manual_seed(3))
    lengths = torch.tensor([7, 3, 1, 7, 5, 2])
    cmask = (torch.arange(t) < lengths[:, None]).float()  # (N, T)
    weights = torch.randn(n, t, 64, generator=torch.Generator().manual_seed(4)) * cmask[..., None]

    def run(fn):
        model.zero_grad()
        logits, where = fn()  # (R, V), (R,)
        (logits * weights.flatten(0, 1)[where]).sum().backward()
        return logits.detach(), where, {k: p.grad.clone() for k, p in model.named_parameters()}

    def reference():
        full = torch.cat([ids, completion], 1)
        full_mask = torch.cat([mask, cmask.long()], 1)
        positions = (full_mask.cumsum(1) - 1).clamp(min=0)
        out = model(input_ids=full, attention_mask=full_mask, position_ids=positions)
        return out.logits[:, ids.shape[1] - 1 : -1].flatten(0, 1), torch.arange(n * t)

    ours, where, our_grads = run(lambda: lean_logits(model, ids, mask, completion, cmask, share))
    theirs, _, their_grads = run(reference)
    # each row's first token, then tokens 1 .. L - 1 of a completion of length L (19 here),
    # and past the ends in row order up to 20 (K rounded to 4 sizes an octave), no more
    scored = [i * t + j for i, length in enumerate(lengths.tolist()) for j in range(1, length)]
    assert where.tolist() == [i * t for i in range(n)] + sorted([*scored, 1 * t + 3])
    valid = cmask.flatten()[where].bool()
    torch.testing.assert_close(ours[valid], theirs[where][valid], atol=1e-5, rtol=0)
    for k, g in their_grads.items():
        torch.testing.assert_close(our_grads[k], g, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("groups", [[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1], [0, 0, 1, 1, 2, 2]])
def test_host_side_groups_give_the_device_grouping(groups) -> None:
    """Groups known on the host (the sampler's) share prompts as finding equal consecutive
    prompts on the device does, also when two groups hold the same prompt (last case)."""
    model = MODELS["llama"].eval()
    ids, mask = _prompts((3, 3) if groups[3] == 1 else (4, 2))
    if groups[-1] == 2:  # rows 0-3 one prompt in two groups of 2
        ids, mask = _prompts((4, 2))
    completion = torch.randint(1, 64, (6, 5), generator=torch.Generator().manual_seed(8))
    cmask = (torch.arange(5) < torch.tensor([5, 2, 4, 5, 1, 3])[:, None]).float()
    with torch.no_grad():
        on_device, where = lean_logits(model, ids, mask, completion, cmask)
        from_host, host_where = lean_logits(model, ids, mask, completion, cmask, groups=groups)
    assert torch.equal(where, host_where)
    torch.testing.assert_close(from_host, on_device, atol=1e-5, rtol=0)


def test_fed_positions_are_the_completions_own_rounded_up() -> None:
    """Positions that predict a completion token, then past-the-end ones in row order until
    K is one of 4 sizes an octave (16, 20, 24, 28, 32, 40, ...); None when that is all."""
    cpu = torch.device("cpu")
    assert fed_index([3, 3], 2, cpu) is None  # every position predicts a token
    needed = [*range(0, 8), *range(18, 28), 30]  # 19 of the 36 (rows of 6, 2, 0, 6, 4, 1)
    assert fed_index([7, 3, 1, 7, 5, 2], 6, cpu).tolist() == sorted([*needed, 8])  # 20
    assert fed_index([7, 7, 7, 7, 7, 6], 6, cpu) is None  # 35 rounds up to all 36
    assert fed_index([1, 1], 4, cpu).tolist() == []  # one-token completions feed nothing


def test_unsupported_models_fall_back(tiny_model) -> None:
    from peft import LoraConfig, get_peft_model

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert supported(model, 64)
    lora = get_peft_model(model, LoraConfig(r=2, target_modules="all-linear", lora_dropout=0.1))
    assert not supported(lora.train(), 64)  # LoRA dropout at work: the model's own forward
    assert supported(lora.eval(), 64)
    assert LeanDecoder.build(lora, 64, rows=4) is not None
    dora = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model),
        LoraConfig(r=2, target_modules="all-linear", use_dora=True),
    )
    assert not supported(dora.eval(), 64)
    assert LeanDecoder.build(dora, 64, rows=4) is None
    windowed = Qwen2ForCausalLM(
        Qwen2Config(**SMALL_LM, use_sliding_window=True, sliding_window=8, max_window_layers=0)
    )
    assert supported(windowed, 8) and not supported(windowed, 9)


@pytest.mark.parametrize("onednn_faster", [True, False])
def test_scoring_in_inference_mode_takes_the_faster_kernel_with_the_same_numbers(
    monkeypatch, onednn_faster: bool
) -> None:
    """pi_ref / pi_old scoring (inference mode, CPU, fp32) multiplies through oneDNN where this
    machine runs the shape faster through it than through F.linear, with the same numbers."""
    from torch.profiler import profile

    model = MODELS["qwen2"].eval()
    ids, mask = _prompts()
    completion = torch.randint(1, 64, (ids.shape[0], 5), generator=torch.Generator().manual_seed(5))
    cmask = torch.ones_like(completion, dtype=torch.float)
    with torch.no_grad():
        plain, _ = lean_logits(model, ids, mask, completion, cmask)
    monkeypatch.setattr(lean, "onednn_is_faster", lambda *shape: onednn_faster)
    with torch.inference_mode(), profile() as prof:
        scored, _ = lean_logits(model, ids, mask, completion, cmask)
    used = any(e.key == "mkldnn::_linear_pointwise" for e in prof.key_averages())
    assert used == onednn_faster
    torch.testing.assert_close(scored, plain, atol=1e-5, rtol=0)


def test_the_kernel_choice_is_measured_once_per_shape() -> None:
    """Measured once per shape, without drawing from the global RNG (exact resume relies on it)."""
    lean.onednn_is_faster.cache_clear()
    torch.manual_seed(1)
    first = lean.onednn_is_faster(64, 48, 32)
    drawn = torch.rand(3)
    torch.manual_seed(1)
    assert torch.equal(torch.rand(3), drawn)
    assert isinstance(first, bool) and lean.onednn_is_faster(64, 48, 32) is first
    assert lean.onednn_is_faster.cache_info().hits == 1


def test_rms_norm_stays_fp32_under_autocast() -> None:
    """Under bf16 autocast (CUDA in production; CPU here) the norm of an fp32 residual stream is
    still computed in fp32, as HF's RMSNorm does: autocast would run a dot product in bf16."""
    gen = torch.Generator().manual_seed(6)
    x, weight = torch.randn(4, 7, 64, generator=gen) * 3, torch.randn(64, generator=gen)
    plain = lean.rms(x, (weight, 1e-6))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = lean.rms(x, (weight, 1e-6))
    assert autocast.dtype == torch.float32
    torch.testing.assert_close(autocast, plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("disabled", [False, True])
@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj", "down_proj"]])
def test_lora_adapters_merged_for_decoding_factored_for_scoring_and_training(
    disabled, targets
) -> None:
    """A LoRA model (peft, adapters trained away from B = 0) decodes with B A merged into the
    weights and scores with the low-rank update applied: the peft model's logits, log-probs
    and gradients of A and B (also where only some maps are adapted); with the adapter
    disabled (pi_ref), the base model's."""
    import contextlib

    from peft import LoraConfig, get_peft_model

    from workers.grpo.fast.logprobs import completion_logprobs

    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets)
    model = get_peft_model(small_lm("qwen2"), config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    ids, mask = _prompts()
    steps = torch.randint(1, 64, (4, ids.shape[0]), generator=torch.Generator().manual_seed(2))

    def context():  # noqa: ANN202
        return model.disable_adapter() if disabled else contextlib.nullcontext()

    with context(), torch.no_grad():
        lean_decoder, ref = LeanDecoder(model, rows=6), _HFForward(model)
        a, b = lean_decoder.prefill(ids, mask, 4), ref.prefill(ids, mask, 4)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        for tokens in steps:
            torch.testing.assert_close(
                lean_decoder.step(tokens), ref.step(tokens), atol=1e-5, rtol=0
            )
    with torch.no_grad(), model.disable_adapter():  # the adapter changes the logits
        base = _HFForward(model).prefill(ids, mask, 4)
    assert ((base - a).abs().max() > 1e-2) != disabled

    completion, cmask = steps.t(), torch.ones(ids.shape[0], 4)  # (N, 4)
    weights = torch.linspace(-1, 1, completion.numel()).view(completion.shape)
    results = []
    for lean_path in (True, False):
        model.zero_grad(set_to_none=True)
        with context(), mock.patch.object(logprobs, "supported", lambda *_, v=lean_path: v):
            lp, _ = completion_logprobs(model, ids, mask, completion, cmask)
            if not disabled:  # (disabled, nothing that requires a gradient is used)
                (lp * weights).sum().backward()
        grads = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
        results.append((lp.detach(), grads))
    (lean_lp, lean_grads), (own_lp, own_grads) = results
    torch.testing.assert_close(lean_lp, own_lp, atol=1e-5, rtol=0)
    assert lean_grads.keys() == own_grads.keys() and len(own_grads) == (
        0
        if disabled
        else 2 * (len(model.base_model.model.model.layers) * (7 if targets == "all-linear" else 3))
    )
    for k, g in own_grads.items():  # lora_A and lora_B of every adapted map
        torch.testing.assert_close(lean_grads[k], g, atol=1e-5, rtol=1e-4, msg=k)


def test_the_padding_token_embedding_gets_no_gradient() -> None:
    """As `nn.Embedding(padding_idx=pad)` in the model: a pad token sampled inside a completion
    feeds the forward, but its embedding row gets no gradient."""
    torch.manual_seed(0)
    model = small_lm("llama", pad_token_id=0)
    ids, mask = _prompts((3, 1))
    completion = torch.tensor([[5, 0, 7, 9], [0, 3, 3, 1], [8, 8, 0, 2], [0, 6, 0, 4]])
    lp, _ = lean_logits(model, ids, mask, completion, torch.ones(4, 4))
    lp.logsumexp(-1).sum().backward()
    grad = model.model.embed_tokens.weight.grad
    assert model.model.embed_tokens.padding_idx == 0
    assert (grad[0] == 0).all() and (grad[5] != 0).any()


@pytest.mark.parametrize(("x_dtype", "w_dtype"), [(torch.float32, torch.float32),
                                                  (torch.bfloat16, torch.bfloat16),
                                                  (torch.bfloat16, torch.float32)])  # fmt: skip
def test_the_fused_norm_gpus_take_is_hfs_rms_norm(x_dtype, w_dtype) -> None:
    """`fused_rms` (the norm on a GPU) computes what HF's RMSNorm computes, in its dtypes."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(3, 5, 64, generator=gen) * 3).to(x_dtype)
    hf = Qwen2RMSNorm(64, eps=1e-6).to(w_dtype)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(64, generator=gen))
    expected = hf(x)
    got = lean.fused_rms(x, (hf.weight, 1e-6))
    assert got.dtype == expected.dtype
    tol = 1e-5 if x_dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
