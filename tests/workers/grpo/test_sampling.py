from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from workers.grpo.config import GenerationParams
from workers.grpo.logprobs import completion_logprobs
from workers.grpo.sampling import Generation, HFSampler, render_prompt

PROMPTS = ["Digit 7:", [{"role": "user", "content": "Say a digit"}]]


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model: Path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    # Make EOS likely (~11% a token) so that sequences end at different steps.
    bias = torch.zeros(model.config.vocab_size)
    bias[tokenizer.eos_token_id] = 2.5
    model.lm_head.register_forward_hook(lambda _m, _i, out: out + bias)
    return model, tokenizer


def _generate(model_and_tokenizer, seed: int = 0, **params) -> Generation:
    model, tokenizer = model_and_tokenizer
    sampler = HFSampler(model, tokenizer, torch.Generator().manual_seed(seed))
    return sampler.generate(PROMPTS, 4, GenerationParams(max_new_tokens=12, **params))


def test_shapes_and_mask_up_to_and_including_eos(model_and_tokenizer) -> None:
    _, tokenizer = model_and_tokenizer
    out = _generate(model_and_tokenizer)
    n, width = out.completion_ids.shape
    assert n == 8 and width <= 12
    assert out.prompt_ids.shape == out.prompt_mask.shape and out.prompt_ids.shape[0] == 8
    assert out.prompt_mask[:, -1].all()  # left padding
    assert out.completion_mask.shape == (n, width) and len(out.texts) == n
    for i in range(n):
        ids, mask = out.completion_ids[i], out.completion_mask[i]
        eos = (ids == tokenizer.eos_token_id).nonzero().flatten().tolist()
        if eos:
            assert mask[: eos[0] + 1].all() and not mask[eos[0] + 1 :].any()
            assert not out.truncated[i]
        else:
            assert mask.all() and width == 12 and out.truncated[i]
        assert out.texts[i] == tokenizer.decode(ids[mask == 1], skip_special_tokens=True)
    assert 0 < out.truncated.sum() < n  # the bias makes both cases occur


def test_stop_strings_cut_text_and_mask(model_and_tokenizer) -> None:
    _, tokenizer = model_and_tokenizer
    stops = list("abcdefghij")
    out = _generate(model_and_tokenizer, stop=stops)
    cut = 0
    for i, text in enumerate(out.texts):
        if any(s in text for s in stops):
            cut += 1
            assert text[-1] in stops and not any(s in text[:-1] for s in stops)
            kept = out.completion_ids[i][out.completion_mask[i] == 1]
            assert tokenizer.decode(kept, skip_special_tokens=True) == text
            assert not out.truncated[i]
    assert cut > 0


def test_same_seed_same_completions(model_and_tokenizer) -> None:
    a = _generate(model_and_tokenizer, seed=3, top_k=20, top_p=0.9, temperature=0.8)
    b = _generate(model_and_tokenizer, seed=3, top_k=20, top_p=0.9, temperature=0.8)
    c = _generate(model_and_tokenizer, seed=4, top_k=20, top_p=0.9, temperature=0.8)
    assert torch.equal(a.completion_ids, b.completion_ids) and a.texts == b.texts
    assert a.texts != c.texts


def test_prompt_rendering(model_and_tokenizer) -> None:
    _, tokenizer = model_and_tokenizer
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render_prompt(tokenizer, "plain") == ("plain", False)
    assert render_prompt(tokenizer, messages) == ("Be brief.\nHi", False)


def test_logprobs_match_an_unpadded_forward(model_and_tokenizer) -> None:
    model, _ = model_and_tokenizer
    out = _generate(model_and_tokenizer, temperature=0.7)
    lp, entropy = completion_logprobs(
        model,
        out.prompt_ids,
        out.prompt_mask,
        out.completion_ids,
        out.completion_mask,
        0.7,
        with_entropy=True,
    )
    assert lp.shape == entropy.shape == out.completion_ids.shape
    for i in (0, 5):  # a long prompt and a left-padded short one
        prompt = out.prompt_ids[i][out.prompt_mask[i] == 1]
        length = int(out.completion_mask[i].sum())
        ids = torch.cat([prompt, out.completion_ids[i, :length]])[None]
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1] / 0.7
        want = logits.log_softmax(-1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
        torch.testing.assert_close(lp[i, :length].detach(), want, atol=1e-5, rtol=0)
    scored = out.completion_mask.bool()
    assert (entropy[scored] > 0).all() and (entropy[~scored] == 0).all()
    assert (lp[~scored] == 0).all() and (~scored).any()  # past a completion's end: 0


def test_chat_template_is_used_when_present(model_and_tokenizer) -> None:
    _, tokenizer = model_and_tokenizer
    saved = tokenizer.chat_template
    tokenizer.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    try:
        text, templated = render_prompt(tokenizer, [{"role": "user", "content": "Hi"}])
    finally:
        tokenizer.chat_template = saved
    assert (text, templated) == ("<user>Hi\n<assistant>", True)


@pytest.mark.parametrize("lean", [True, False])
def test_kept_logprobs_are_pi_old_of_the_training_pass(model_and_tokenizer, lean) -> None:
    """With keep_logprobs the sampler returns log pi(y_t) under softmax(logits / T), before
    top-k / top-p (the distribution the training pass scores), 0 after each completion's end."""
    model, tokenizer = model_and_tokenizer
    params = GenerationParams(max_new_tokens=12, temperature=0.7, top_k=20, top_p=0.9)
    sampler = HFSampler(model, tokenizer, torch.Generator().manual_seed(3), lean=lean)
    out = sampler.generate(PROMPTS, 4, params, keep_logprobs=True)
    again = HFSampler(model, tokenizer, torch.Generator().manual_seed(3), lean=lean)
    plain = again.generate(PROMPTS, 4, params)
    assert plain.logprobs is None and torch.equal(plain.completion_ids, out.completion_ids)
    scored, _ = completion_logprobs(
        model, out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask, 0.7
    )
    mask = out.completion_mask.bool()
    torch.testing.assert_close(out.logprobs[mask], scored.detach()[mask], rtol=0, atol=2e-5)
    assert (out.logprobs[~mask] == 0).all() and (out.logprobs[mask] < 0).all()


@pytest.mark.parametrize("lean", [True, False])
def test_reading_the_ends_every_few_steps_gives_the_same_completions(
    model_and_tokenizer, monkeypatch, lean
) -> None:
    """As on an accelerator (every 8 steps): the pad steps decoded after the last end are cut,
    the completions, masks and pi_old (up to rounding) are those of reading the ends at every
    step."""
    from workers.grpo import lean_decode, sampling

    model, tokenizer = model_and_tokenizer
    steps: list[int] = []
    for cls, name in ((lean_decode.LeanDecoder, "step"), (sampling._HFForward, "step")):
        real = getattr(cls, name)
        monkeypatch.setattr(
            cls, name, lambda self, tokens, _real=real: steps.append(1) or _real(self, tokens)
        )
    params = GenerationParams(max_new_tokens=40)
    outs, decoded = [], []
    for every in (1, 8):
        steps.clear()
        sampler = HFSampler(model, tokenizer, torch.Generator().manual_seed(4), lean, None, every)
        outs.append(sampler.generate(PROMPTS, 4, params, keep_logprobs=True))
        decoded.append(len(steps))
    each, every8 = outs
    assert not each.truncated.any()  # all ended before 40 tokens, at different steps
    last_end = max(each.lengths)
    assert decoded[0] == last_end - 1 and decoded[1] == min(-(-last_end // 8) * 8, 40) - 1
    assert decoded[1] > decoded[0]  # pads were decoded past the last end, then cut
    assert each.texts == every8.texts and each.lengths == every8.lengths
    for field in ("completion_ids", "completion_mask"):
        assert torch.equal(getattr(each, field), getattr(every8, field)), field
    # the ended rows are retired at other steps: products over other row counts, other rounding
    torch.testing.assert_close(each.logprobs, every8.logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("lean", "share"), [(True, True), (True, False), (False, False)])
def test_ended_rows_stop_being_decoded_with_the_same_completions(
    model_and_tokenizer, monkeypatch, lean, share
) -> None:
    """The decoder drops rows as they end (`RETIRE_AT`): fewer rows fed per step, the
    completions, masks and pi_old (up to rounding) of decoding every row to the end; the lean
    decoder also where the prompts' keys and values are kept once per group, and the model's
    own forward with its KV cache."""
    from workers.grpo import lean_decode, sampling

    monkeypatch.setattr(lean_decode, "SHARE_MIN_PROMPT_BYTES", 0 if share else 2**40)
    model, tokenizer = model_and_tokenizer
    rows: list[int] = []
    decoder = lean_decode.LeanDecoder if lean else sampling._HFForward
    real = decoder.step
    monkeypatch.setattr(
        decoder, "step", lambda self, tokens: rows.append(tokens.shape[0]) or real(self, tokens)
    )
    params = GenerationParams(max_new_tokens=40)
    outs, fed = [], []
    for retire_at in (0.0, 0.75):
        monkeypatch.setattr(sampling, "RETIRE_AT", retire_at)
        rows.clear()
        sampler = HFSampler(model, tokenizer, torch.Generator().manual_seed(4), lean)
        outs.append(sampler.generate(PROMPTS, 4, params, keep_logprobs=True))
        fed.append(list(rows))
    kept, retired = outs
    assert set(fed[0]) == {8} and len(fed[1]) == len(fed[0])
    assert fed[1] == sorted(fed[1], reverse=True) and fed[1][-1] <= 6  # 8 -> 6 or fewer
    assert sum(fed[1]) < 0.8 * sum(fed[0])
    assert kept.texts == retired.texts and kept.lengths == retired.lengths
    for field in ("completion_ids", "completion_mask"):
        assert torch.equal(getattr(kept, field), getattr(retired, field)), field
    torch.testing.assert_close(kept.logprobs, retired.logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("sizes", [(3, 3), (4, 2), (1, 1)])
def test_the_models_own_forward_prefills_each_distinct_prompt_once(
    model_and_tokenizer, sizes
) -> None:
    """Through the model's own forward and KV cache: U prompts run at prefill, not N rows; the
    prefill and every step's logits are those of the whole sequences run without a cache."""
    from workers.grpo.sampling import _HFForward

    model, tokenizer = model_and_tokenizer
    ids, mask = HFSampler(model, tokenizer, torch.Generator()).encode_prompts(["Digit 7:", "Go"])
    repeats = torch.tensor(sizes)
    ids, mask = ids.repeat_interleave(repeats, 0), mask.repeat_interleave(repeats, 0)  # (N, P)
    shapes: list[tuple[int, ...]] = []
    hook = model.register_forward_pre_hook(
        lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    steps = torch.randint(4, 90, (3, ids.shape[0]), generator=torch.Generator().manual_seed(1))
    try:
        with torch.no_grad():
            forward = _HFForward(model)
            got = [forward.prefill(ids, mask, 3)] + [forward.step(t) for t in steps]
            assert shapes[0] == (len(sizes), ids.shape[1])  # (U, P)
            for j in range(len(got)):
                seq = torch.cat([ids, steps[:j].t()], 1)  # (N, P + j)
                full = torch.cat([mask, torch.ones_like(steps[:j].t())], 1)
                pos = (full.cumsum(1) - 1).clamp(min=0)
                want = model(input_ids=seq, attention_mask=full, position_ids=pos).logits[:, -1]
                torch.testing.assert_close(got[j], want, atol=1e-5, rtol=0)
    finally:
        hook.remove()
