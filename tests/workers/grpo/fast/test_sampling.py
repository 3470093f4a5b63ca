"""The fast decoder's own work: ends read every few steps, ended rows retired, prompts
prefilled once through the model's own forward; each gives the completions of the plain loop."""

import pytest
import torch

from workers.grpo.config import GenerationParams
from workers.grpo.fast import lean_decode, sampling
from workers.grpo.fast.sampling import FastSampler, _HFForward
from workers.grpo.text import encode_prompts

PROMPTS = ["Digit 7:", [{"role": "user", "content": "Say a digit"}]]


@pytest.mark.parametrize("lean", [True, False])
def test_reading_the_ends_every_few_steps_gives_the_same_completions(
    model_and_tokenizer, monkeypatch, lean
) -> None:
    """As on an accelerator (every 8 steps): the pad steps decoded after the last end are cut,
    the completions, masks and pi_old (up to rounding) are those of reading the ends at every
    step."""
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
        sampler = FastSampler(model, tokenizer, torch.Generator().manual_seed(4), lean, None, every)
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
        sampler = FastSampler(model, tokenizer, torch.Generator().manual_seed(4), lean)
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
    model, tokenizer = model_and_tokenizer
    ids, mask = encode_prompts(tokenizer, ["Digit 7:", "Go"])
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
