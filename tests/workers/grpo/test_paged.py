"""The paged engine (transformers' continuous batching) is pinned to the reference path: it
draws with the engine's kernel, so its sampled completions are the reference sampler's for the
same seed (a batch split in two included) and its log-probs the reference forward's of the same
ids; its greedy completions are the reference sampler's (stop strings, `max_new_tokens`, LoRA
adapters and every served family included), and a short run with it trains.
`grpo.engine` / `GRPO_ENGINE` choose it."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from pydantic import ValidationError
from safetensors.torch import load_file
from transformers import MistralConfig, MistralForCausalLM

from tests.workers.grpo.helpers import Recorder, small_lm, small_spec
from workers.grpo.backend import PagedBackend, ReferenceBackend, select_backend
from workers.grpo.config import GenerationParams, GRPOParams
from workers.grpo.draw import RowSeeds, draw_base
from workers.grpo.paged import PagedSampler, serving_refusal
from workers.grpo.sampling import Generation, PlainSampler
from workers.grpo.trainer import train

PROMPTS = ["Digit 7:", "Say a digit, any one"]


@pytest.fixture(scope="module")
def plain(tiny_model, model_and_tokenizer):
    """The tiny model without the EOS bias: greedy completions run to max_new_tokens or a stop."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model).eval(), model_and_tokenizer[1]


def _paged(model, tokenizer, seed: int = 5, **params) -> Generation:
    gen = GenerationParams(**{"max_new_tokens": 16, "temperature": 0.8} | params)
    sampler = PagedSampler(model, tokenizer, torch.Generator().manual_seed(seed))
    return sampler.generate(PROMPTS, 4, gen, keep_logprobs=True)


def _pair(model, tokenizer, seed: int = 0, **params) -> tuple[Generation, Generation]:
    """The completions of the paged and the reference sampler for the same seed."""
    gen = GenerationParams(**{"max_new_tokens": 12} | params)
    outs = []
    for cls in (PagedSampler, PlainSampler):
        sampler = cls(model, tokenizer, torch.Generator().manual_seed(seed))
        outs.append(sampler.generate(PROMPTS, 2, gen))
    return outs[0], outs[1]


def _greedy_pair(model, tokenizer, **params) -> tuple[Generation, Generation]:
    """Greedy (top-k 1) completions of the paged and the reference sampler."""
    return _pair(model, tokenizer, **{"top_k": 1} | params)


def _assert_same(paged: Generation, ref: Generation) -> None:
    assert paged.texts == ref.texts and paged.lengths == ref.lengths
    assert torch.equal(paged.prompt_ids, ref.prompt_ids)
    assert torch.equal(paged.completion_ids, ref.completion_ids)
    assert torch.equal(paged.completion_mask, ref.completion_mask)
    assert torch.equal(paged.truncated, ref.truncated)


def test_log_probs_are_the_reference_forwards(model_and_tokenizer) -> None:
    model, tokenizer = model_and_tokenizer
    out = _paged(model, tokenizer, max_new_tokens=8)
    assert len(set(out.lengths)) > 1  # rows ended at different steps (EOS)
    rows, cols = slice(None), slice(None)
    with torch.inference_mode():
        ref = ReferenceBackend().logprobs(model, out, rows, cols, 0.8)  # (N, T)
    mask = out.completion_mask.bool()
    assert out.logprobs is not None
    torch.testing.assert_close(out.logprobs[mask], ref[mask], atol=1e-5, rtol=0)
    assert not out.logprobs[~mask].any()
    eos, ends = tokenizer.eos_token_id, torch.tensor(out.lengths) - 1
    last = out.completion_ids[torch.arange(len(ends)), ends]  # (N,) each row's last token
    assert torch.equal(out.truncated, (last != eos) & (ends + 1 == 8))
    assert out.truncated.any() and not out.truncated.all()


@pytest.mark.parametrize("filters", [{"top_k": 20}, {"top_p": 0.9}])
def test_log_probs_under_top_k_or_top_p_are_the_policys(model_and_tokenizer, filters) -> None:
    """As every decoder keeps them: log softmax(logits / T), before the filters."""
    model, tokenizer = model_and_tokenizer
    out = _paged(model, tokenizer, max_new_tokens=8, **filters)
    with torch.inference_mode():
        ref = ReferenceBackend().logprobs(model, out, slice(None), slice(None), 0.8)  # (N, T)
    mask = out.completion_mask.bool()
    assert out.logprobs is not None
    torch.testing.assert_close(out.logprobs[mask], ref[mask], atol=1e-5, rtol=0)


@pytest.mark.parametrize("params", [{}, {"top_k": 20, "top_p": 0.95}, {"temperature": 1.3}])
def test_sampled_completions_are_the_reference_samplers(plain, params) -> None:
    """The same kernel and the same seeded uniforms per row and step: the same tokens."""
    paged, ref = _pair(*plain, seed=3, **{"temperature": 0.9} | params)
    _assert_same(paged, ref)
    assert len(set(paged.texts)) > 1  # sampled, not greedy


def test_a_batch_split_in_two_samples_as_one(plain) -> None:
    """Rows keep their noise by their index in the whole batch (`first_row`): N ranks as one."""
    model, tokenizer = plain
    gen = GenerationParams(max_new_tokens=10, temperature=0.9)
    whole = PagedSampler(model, tokenizer, torch.Generator().manual_seed(4))
    halves = PagedSampler(model, tokenizer, torch.Generator().manual_seed(4))
    one = whole.generate(PROMPTS, 2, gen)
    base = torch.Generator().manual_seed(4)
    seeds = RowSeeds(draw_base(base), [0, 1])
    first = halves.generate(PROMPTS[:1], 2, gen, seeds=seeds)
    second = halves.generate(PROMPTS[1:], 2, gen, seeds=seeds.shifted(2))
    assert first.texts + second.texts == one.texts


def test_the_same_seed_samples_the_same_completions(model_and_tokenizer) -> None:
    model, tokenizer = model_and_tokenizer
    state = torch.random.get_rng_state()
    a, b, c = (_paged(model, tokenizer, seed=s) for s in (5, 5, 6))
    assert torch.equal(torch.random.get_rng_state(), state)  # the global generator is restored
    assert a.texts == b.texts and torch.equal(a.completion_ids, b.completion_ids)
    assert a.texts != c.texts


def test_greedy_completions_are_the_reference_samplers(plain) -> None:
    paged, ref = _greedy_pair(*plain)
    _assert_same(paged, ref)
    assert paged.truncated.all() and paged.lengths == [12] * 4  # max_new_tokens


def test_a_stop_string_cuts_a_row_where_the_reference_does(plain) -> None:
    """Found after the decode, step by step as the reference loop finds it."""
    model, tokenizer = plain
    free, _ = _greedy_pair(model, tokenizer)
    longest = max(range(len(free.texts)), key=lambda i: len(free.texts[i]))
    stop = free.texts[longest][3:5]  # two characters in the middle of the longest completion
    paged, ref = _greedy_pair(model, tokenizer, stop=[stop])
    _assert_same(paged, ref)
    assert paged.texts[longest].endswith(stop) and paged.lengths[longest] < free.lengths[longest]


def test_lora_adapters_apply_and_stay_unmerged(tiny_model, plain) -> None:
    from transformers import AutoModelForCausalLM

    tokenizer = plain[1]
    base = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    before, _ = _greedy_pair(base, tokenizer)
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=64, target_modules="all-linear", init_lora_weights=False)
    model = get_peft_model(base, config).eval()
    paged, ref = _greedy_pair(model, tokenizer)
    _assert_same(paged, ref)
    assert paged.texts != before.texts  # the adapter changed the completions
    assert not any(getattr(m, "merged", False) for m in model.modules())


def _mistral():
    return MistralForCausalLM(
        MistralConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    )  # fmt: skip


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_every_served_family_decodes_as_the_reference(family, model_and_tokenizer) -> None:
    torch.manual_seed(0)
    model = _mistral() if family == "mistral" else small_lm(family, vocab_size=100)
    model = model.eval()
    assert serving_refusal(model) is None
    _assert_same(*_greedy_pair(model, model_and_tokenizer[1], max_new_tokens=6))


def test_the_engine_is_chosen_by_the_job_then_the_environment(monkeypatch) -> None:
    model = small_lm("llama")
    monkeypatch.delenv("GRPO_ENGINE", raising=False)
    assert select_backend(model).name == "fast"  # auto on a CPU: today's fast path
    monkeypatch.setenv("GRPO_ENGINE", "paged")
    assert isinstance(select_backend(model), PagedBackend)
    assert select_backend(model, GRPOParams(engine="reference")).name == "reference"
    monkeypatch.setenv("GRPO_ENGINE", "auto")
    assert select_backend(model, GRPOParams(engine="paged")).name == "paged"


def test_paged_on_a_model_it_cannot_serve_is_refused(monkeypatch) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=100))
    assert "gpt2" in (serving_refusal(gpt2) or "")
    with pytest.raises(ValueError, match="grpo.engine / GRPO_ENGINE paged: .*not 'gpt2'"):
        select_backend(gpt2, GRPOParams(engine="paged"))
    monkeypatch.setenv("GRPO_ENGINE", "auto")
    assert select_backend(gpt2).name in ("fast", "reference")  # auto falls back
    with pytest.raises(ValidationError, match="engine"):
        GRPOParams(engine="turbo")


def test_two_steps_with_the_paged_engine_train(
    monkeypatch, tiny_model, digit_records, digit_scorer, tmp_path
) -> None:
    monkeypatch.setenv("GRPO_ENGINE", "paged")
    spec = small_spec(tiny_model, steps=2, beta=0.04, max_new_tokens=8, num_iterations=2)
    hooks = Recorder()
    result = train(spec, digit_records, [digit_scorer], tmp_path, hooks)
    assert result.steps_completed == 2 and sorted(hooks.metrics) == [1, 2]
    for m in hooks.metrics.values():
        assert all(torch.isfinite(torch.tensor(v)) for v in m.values())
        assert m["completion_len_mean"] > 0 and m["grad_norm"] > 0
    before = load_file(tiny_model / "model.safetensors")
    after = load_file(result.final_checkpoint / "model.safetensors")
    assert all(not torch.equal(before[k], after[k]) for k in before)
