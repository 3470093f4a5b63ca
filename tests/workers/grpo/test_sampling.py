"""Sampling G completions per prompt: both decoders (the reference one and the fast one)."""

import pytest
import torch

from workers.grpo import sampling
from workers.grpo.config import GenerationParams
from workers.grpo.fast.sampling import FastSampler
from workers.grpo.logprobs import completion_logprobs
from workers.grpo.sampling import Generation, PlainSampler
from workers.grpo.text import render_prompt

PROMPTS = ["Digit 7:", [{"role": "user", "content": "Say a digit"}]]


@pytest.fixture(params=["reference", "fast"])
def kind(request) -> str:
    return request.param


def _generate(model_and_tokenizer, seed: int = 0, kind: str = "fast", **params) -> Generation:
    model, tokenizer = model_and_tokenizer
    sampler = (PlainSampler if kind == "reference" else FastSampler)(
        model, tokenizer, torch.Generator().manual_seed(seed)
    )
    return sampler.generate(PROMPTS, 4, GenerationParams(max_new_tokens=12, **params))


def test_shapes_and_mask_up_to_and_including_eos(model_and_tokenizer, kind) -> None:
    _, tokenizer = model_and_tokenizer
    out = _generate(model_and_tokenizer, seed=1, kind=kind)  # a seed whose draws show both ends
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


def test_stop_strings_cut_text_and_mask(model_and_tokenizer, kind) -> None:
    _, tokenizer = model_and_tokenizer
    stops = list("abcdefghij")
    out = _generate(model_and_tokenizer, kind=kind, stop=stops)
    cut = 0
    for i, text in enumerate(out.texts):
        if any(s in text for s in stops):
            cut += 1
            assert text[-1] in stops and not any(s in text[:-1] for s in stops)
            kept = out.completion_ids[i][out.completion_mask[i] == 1]
            assert tokenizer.decode(kept, skip_special_tokens=True) == text
            assert not out.truncated[i]
    assert cut > 0


def test_same_seed_same_completions(model_and_tokenizer, kind) -> None:
    a = _generate(model_and_tokenizer, seed=3, kind=kind, top_k=20, top_p=0.9, temperature=0.8)
    b = _generate(model_and_tokenizer, seed=3, kind=kind, top_k=20, top_p=0.9, temperature=0.8)
    c = _generate(model_and_tokenizer, seed=4, kind=kind, top_k=20, top_p=0.9, temperature=0.8)
    assert torch.equal(a.completion_ids, b.completion_ids) and a.texts == b.texts
    assert a.texts != c.texts


def test_prompt_rendering(model_and_tokenizer) -> None:
    _, tokenizer = model_and_tokenizer
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render_prompt(tokenizer, "plain") == ("plain", False)
    assert render_prompt(tokenizer, messages) == ("Be brief.\nHi", False)


def test_logprobs_match_an_unpadded_forward(model_and_tokenizer) -> None:
    """The reference forward (`logprobs.completion_logprobs`) is each sequence's own forward."""
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


@pytest.mark.parametrize("decoder", ["reference", "lean", "own-forward"])
def test_kept_logprobs_are_pi_old_of_the_training_pass(model_and_tokenizer, decoder) -> None:
    """With keep_logprobs the sampler returns log pi(y_t) under softmax(logits / T), before
    top-k / top-p (the distribution the training pass scores), 0 after each completion's end.
    The fast decoder decodes lean or through the model's own forward."""
    model, tokenizer = model_and_tokenizer

    def sampler():
        seeded = torch.Generator().manual_seed(3)
        if decoder == "reference":
            return PlainSampler(model, tokenizer, seeded)
        return FastSampler(model, tokenizer, seeded, lean=decoder == "lean")

    params = GenerationParams(max_new_tokens=12, temperature=0.7, top_k=20, top_p=0.9)
    out = sampler().generate(PROMPTS, 4, params, keep_logprobs=True)
    plain = sampler().generate(PROMPTS, 4, params)
    assert plain.logprobs is None and torch.equal(plain.completion_ids, out.completion_ids)
    scored, _ = completion_logprobs(
        model, out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask, 0.7
    )
    mask = out.completion_mask.bool()
    torch.testing.assert_close(out.logprobs[mask], scored.detach()[mask], rtol=0, atol=2e-5)
    assert (out.logprobs[~mask] == 0).all() and (out.logprobs[mask] < 0).all()


@pytest.mark.parametrize("vocab", [1000, 50_000])
def test_inverse_cdf_draws_the_token_where_the_mass_is_reached(vocab: int) -> None:
    """Small vocabularies in one scan, large ones in two levels (blocks, then the block's
    tokens): either way the drawn token is where the cumulative mass reaches u * total (to
    fp32 rounding, checked in fp64), never a token of mass 0, also at u = 1 and with the mass
    all in the last, partial block."""
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(64, vocab, generator=gen) ** 8  # uneven masses
    probs[:32] = probs[:32].masked_fill(torch.rand(32, vocab, generator=gen) < 0.9, 0.0)
    probs[5] = 0.0
    probs[5, -3:] = torch.tensor([0.2, 0.0, 0.5])  # the last block only, a 0 between
    u = torch.rand(64, generator=gen).clamp(min=1e-6)
    u[:4] = 1.0
    token = sampling.inverse_cdf(probs, u)
    assert (probs.gather(1, token.unsqueeze(1)) > 0).all()
    cum = probs.double().cumsum(-1)  # (N, V)
    target = u.double() * cum[:, -1]
    reached = cum.gather(1, token.unsqueeze(1)).squeeze(1)
    before = reached - probs.double().gather(1, token.unsqueeze(1)).squeeze(1)
    tol = 1e-5 * cum[:, -1]
    assert (reached >= target - tol).all() and (before <= target + tol).all()
    assert token[5].item() in (vocab - 3, vocab - 1)
