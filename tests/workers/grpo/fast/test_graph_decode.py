"""The fixed-shape decode step (`graph_decode.StaticStep`, a CUDA graph on a GPU) run eagerly on
the CPU: the completions and pi_old of the decoder's own steps, and none of its shortcuts."""

import pytest
import torch

from workers.grpo.config import GenerationParams
from workers.grpo.fast import graph_decode, lean_decode
from workers.grpo.fast.sampling import FastSampler
from workers.grpo.text import encode_groups

PROMPTS = ["Digit 7:", [{"role": "user", "content": "Say a digit"}], "A much longer prompt, 3 4"]


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model):
    """The tiny model with EOS made likely through the LM head's bias (a hook would keep the
    fixed-shape steps off: they map with the head's weights themselves)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    bias = torch.zeros(model.config.vocab_size)
    bias[tokenizer.eos_token_id] = 2.5
    model.lm_head.bias = torch.nn.Parameter(bias)
    return model, tokenizer


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fixed_shape_steps_give_the_decoders_completions(
    model_and_tokenizer, monkeypatch, temperature
) -> None:
    model, tokenizer = model_and_tokenizer
    computed: list[int] = []
    real = graph_decode.StaticStep._compute
    monkeypatch.setattr(
        graph_decode.StaticStep, "_compute", lambda self: computed.append(1) or real(self)
    )
    params = GenerationParams(max_new_tokens=24, temperature=temperature)
    outs = []
    for static in (False, True):
        sampler = FastSampler(
            model, tokenizer, torch.Generator().manual_seed(3), static_steps=static
        )
        outs.append(sampler.generate(PROMPTS, 4, params, keep_logprobs=True))
    own, fixed = outs
    assert computed  # the fixed-shape steps ran
    assert own.texts == fixed.texts and own.lengths == fixed.lengths
    for field in ("completion_ids", "completion_mask"):
        assert torch.equal(getattr(own, field), getattr(fixed, field)), field
    torch.testing.assert_close(own.logprobs, fixed.logprobs, atol=1e-5, rtol=0)


def test_fixed_shape_steps_feed_every_row_and_record_nothing(model_and_tokenizer, monkeypatch):
    """No ended row is retired (shapes stay), prompts are not shared, no replay is recorded."""
    monkeypatch.setattr(lean_decode, "SHARE_MIN_PROMPT_BYTES", 0)
    model, tokenizer = model_and_tokenizer
    retired = []
    monkeypatch.setattr(lean_decode.LeanDecoder, "retire", lambda self, keep: retired.append(keep))
    sampler = FastSampler(
        model, tokenizer, torch.Generator().manual_seed(4), record=True, static_steps=True
    )
    out = sampler.generate(PROMPTS, 4, GenerationParams(max_new_tokens=40), keep_logprobs=True)
    assert not retired and out.backend_state is None
    assert len(set(out.lengths)) > 1  # rows ended at different steps, all fed to the end


def test_a_hooked_head_keeps_the_decoders_own_steps(model_and_tokenizer, monkeypatch) -> None:
    model, tokenizer = model_and_tokenizer
    handle = model.lm_head.register_forward_hook(lambda _m, _i, out: out)
    try:
        decoder = lean_decode.LeanDecoder(model)
        assert not graph_decode.applies(decoder)
    finally:
        handle.remove()
    assert graph_decode.applies(lean_decode.LeanDecoder(model))


def test_graphs_only_on_a_gpu_and_can_be_turned_off(monkeypatch) -> None:
    assert not graph_decode.graphs_enabled(torch.device("cpu"))
    assert graph_decode.graphs_enabled(torch.device("cuda"))
    monkeypatch.setenv("GRPO_CUDA_GRAPHS", "0")
    assert not graph_decode.graphs_enabled(torch.device("cuda"))


def test_compiled_layers_compute_the_eager_layers_steps(model_and_tokenizer, monkeypatch) -> None:
    """`decode_layer` through `torch.compile` (on a GPU it is compiled by default) gives the
    eager layer's logits, step after step, and writes the same cache in place. Dynamo's whole
    graph and its functionalised cache writes are what is tested: aot_eager runs them as ATen
    ops (inductor's C++ build of the same graph takes ~50 s on 2 cores; on a GPU it is
    Triton's, checked by bench/gpu.sh's token-for-token comparison)."""
    monkeypatch.setattr(graph_decode, "BACKEND", "aot_eager")
    model, tokenizer = model_and_tokenizer
    ids, mask = encode_groups(tokenizer, PROMPTS, 2, torch.device("cpu"))  # (6, P)
    runs = []
    for compiled in (False, True):
        decoder = lean_decode.LeanDecoder(model, pack=False)
        with torch.inference_mode():
            decoder.prefill(ids, mask, 8, share=False)
            step = graph_decode.StaticStep(decoder, capture=False, compiled=compiled)
            assert (step.layer is not graph_decode.decode_layer) == compiled  # no fallback
            tokens = torch.arange(ids.shape[0]) + 5
            logits = torch.stack([step.step(tokens + t).clone() for t in range(6)])
        runs.append((logits, torch.stack([torch.stack(kv) for kv in decoder.cache])))
    (eager, eager_cache), (compiled_logits, compiled_cache) = runs
    assert eager.abs().max() > 0
    torch.testing.assert_close(compiled_logits, eager, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(compiled_cache, eager_cache, atol=1e-5, rtol=1e-5)


def test_layers_compiled_only_where_graphs_are_captured(monkeypatch) -> None:
    assert not graph_decode.compile_enabled(torch.device("cpu"))
    assert graph_decode.compile_enabled(torch.device("cuda"))
    monkeypatch.setenv("GRPO_COMPILE_DECODE", "0")
    assert not graph_decode.compile_enabled(torch.device("cuda"))
