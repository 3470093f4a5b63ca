"""LoraHost: training runs as LoRA adapters on one base model, their state, their isolation."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.workers.tinker.conftest import rl_datum, sft_datum
from workers.tinker.types import AdamParams, LoraConfig

TEXTS = ["abc=abcabc", "xyz=xyzxyz", "12=1212"]
ADAM = AdamParams(learning_rate=3e-3)


def sft_batch(host) -> list:  # noqa: ANN001
    return [sft_datum(host.tokenizer, t) for t in TEXTS]


def rl_batch(host) -> list:  # noqa: ANN001
    return [
        rl_datum(host.tokenizer, t, adv) for t, adv in zip(TEXTS, [1.0, -0.5, 0.25], strict=True)
    ]


def train(host, run: str, steps: int, loss_fn: str = "cross_entropy") -> list[float]:  # noqa: ANN001
    losses = []
    for _ in range(steps):
        data = sft_batch(host) if loss_fn == "cross_entropy" else rl_batch(host)
        losses.append(host.forward_backward(run, data, loss_fn).metrics["loss:sum"])
        host.optim_step(run, ADAM)
    return losses


def test_cross_entropy_steps_lower_the_loss(make_host) -> None:  # noqa: ANN001
    host = make_host()
    host.create_run("a", LoraConfig(rank=8))
    before = host.forward("a", sft_batch(host), "cross_entropy").metrics["loss:sum"]
    train(host, "a", 8)
    after = host.forward("a", sft_batch(host), "cross_entropy").metrics["loss:sum"]
    assert after < 0.6 * before
    assert host.optim_step("a", ADAM)["step"] == 9.0


def test_outputs_are_the_loss_of_the_returned_logprobs(make_host) -> None:  # noqa: ANN001
    """importance_sampling's loss:sum is -sum exp(lp - q) A over the logprobs it returns, and
    the logprobs equal a plain forward of the base model (a fresh adapter adds B A = 0)."""
    host = make_host()
    host.create_run("a", LoraConfig(rank=4))
    data = rl_batch(host)
    out = host.forward_backward("a", data, "importance_sampling")
    want = 0.0
    for d, o in zip(data, out.loss_fn_outputs, strict=True):
        x = d.loss_fn_inputs
        triples = zip(o["logprobs"], x["logprobs"], x["advantages"], strict=True)
        terms = [-math.exp(lp - q) * a for lp, q, a in triples]
        assert o["elementwise_loss"] == pytest.approx(terms, rel=1e-5)
        want += sum(terms)
    assert out.metrics["loss:sum"] == pytest.approx(want, rel=1e-5)
    ids = torch.tensor([data[0].tokens], device=host.model.device)
    with torch.no_grad(), host.adapters.active(None):
        logits = host.model(input_ids=ids).logits[0]
    lp = logits.log_softmax(-1).gather(
        1, torch.tensor(data[0].loss_fn_inputs["target_tokens"], device=ids.device)[:, None]
    )
    assert out.loss_fn_outputs[0]["logprobs"] == pytest.approx(lp[:, 0].tolist(), abs=1e-5)
    # the gradient reached this run's B matrices only (A A^T B grads: B's grad nonzero)
    grads = [p.grad for p in host.adapters.parameters(host._runs["a"].name)]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)


def test_two_runs_interleaved_equal_each_alone(make_host) -> None:  # noqa: ANN001
    alone = {}
    for run, cfg, loss in [("a", LoraConfig(rank=8, seed=1), "cross_entropy"),
                           ("b", LoraConfig(rank=4, seed=2, train_mlp=False), "ppo")]:  # fmt: skip
        host = make_host()
        host.create_run(run, cfg)
        alone[run] = train(host, run, 4, loss)
    host = make_host()
    host.create_run("a", LoraConfig(rank=8, seed=1))
    host.create_run("b", LoraConfig(rank=4, seed=2, train_mlp=False))
    mixed = {"a": [], "b": []}
    for _ in range(4):  # b's forward_backward lands between a's and a's optim_step
        mixed["a"].append(
            host.forward_backward("a", sft_batch(host), "cross_entropy").metrics["loss:sum"]
        )
        mixed["b"].append(host.forward_backward("b", rl_batch(host), "ppo").metrics["loss:sum"])
        host.sample("b", [1, 40, 41], 2, _greedy())
        host.optim_step("a", ADAM)
        host.optim_step("b", ADAM)
    for run in "ab":
        assert mixed[run] == pytest.approx(alone[run], abs=1e-6, rel=0)
    assert alone["a"][-1] < alone["a"][0]


def _greedy():  # noqa: ANN202
    from workers.tinker.types import SamplingParams

    return SamplingParams(max_tokens=3, temperature=0.0)


def test_save_and_load_state_resume_exactly(make_host, tmp_path: Path) -> None:  # noqa: ANN001
    host = make_host()
    host.create_run("a", LoraConfig(rank=8, seed=3))
    train(host, "a", 3)
    host.save_state("a", tmp_path / "ckpt")
    want = train(host, "a", 2)
    other = make_host()
    other.load_state("b", tmp_path / "ckpt")
    assert train(other, "b", 2) == pytest.approx(want, abs=1e-6, rel=0)
    # weights only: the same next loss, a different (fresh-Adam) step after it
    fresh = make_host()
    fresh.load_state("c", tmp_path / "ckpt", with_optimizer=False)
    got = train(fresh, "c", 2)
    assert got[0] == pytest.approx(want[0], abs=1e-6)
    assert got[1] != pytest.approx(want[1], abs=1e-6)


def test_save_for_sampler_loads_with_peft(make_host, tiny_model_dir: Path, tmp_path: Path) -> None:  # noqa: ANN001
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    host = make_host()
    host.create_run("a", LoraConfig(rank=8))
    train(host, "a", 3)
    host.save_for_sampler("a", tmp_path / "sampler")
    assert (tmp_path / "sampler" / "adapter_model.safetensors").is_file()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, tmp_path / "sampler").eval().to(host.model.device)
    ids = torch.tensor([sft_batch(host)[0].tokens], device=host.model.device)
    with torch.no_grad():
        theirs = model(input_ids=ids).logits
        with host.adapters.active(host._runs["a"].name):
            ours = host.model(input_ids=ids).logits
        with host.adapters.active(None):
            plain = host.model(input_ids=ids).logits
    assert torch.allclose(theirs, ours, atol=1e-5)
    assert not torch.allclose(plain, ours, atol=1e-3)  # the adapter trained: it changes logits


def test_eviction_and_reload_keep_results_exact(make_host, tmp_path: Path) -> None:  # noqa: ANN001
    ref = make_host()
    for run in ("a", "b", "c"):
        ref.create_run(run, LoraConfig(rank=4, seed=ord(run)))
    want = {run: [] for run in "abc"}
    host = make_host(max_resident_runs=2, state_dir=tmp_path / "shared")
    for run in ("a", "b", "c"):
        host.create_run(run, LoraConfig(rank=4, seed=ord(run)))
    assert host.resident_runs() == ["b", "c"]  # a was evicted for c
    other = make_host(max_resident_runs=1, state_dir=tmp_path / "shared")  # its own files
    for run in ("a", "b"):
        other.create_run(run, LoraConfig(rank=4, seed=99))
    got = {run: [] for run in "abc"}
    for h, out in ((ref, want), (host, got)):
        for _ in range(2):
            for run in "abc":  # gradients pending while other runs evict this one
                out[run].append(
                    h.forward_backward(run, sft_batch(h), "cross_entropy").metrics["loss:sum"]
                )
            for run in "abc":
                h.optim_step(run, ADAM)
        for run in "abc":
            out[run].append(h.forward(run, sft_batch(h), "cross_entropy").metrics["loss:sum"])
    assert got == want
    assert len(host.resident_runs()) == 2
    host.evict("c")
    assert host.resident_runs() == ["b"]
    host.delete_run("c")
    assert not host.has_run("c")


def test_chunked_batches_give_the_whole_batch_loss_and_gradients(make_host, monkeypatch) -> None:  # noqa: ANN001
    from workers.tinker import batches

    host = make_host()
    host.create_run("a", LoraConfig(rank=4))
    train(host, "a", 1)  # B != 0: every matrix gets a gradient
    params = host.adapters.parameters(host._runs["a"].name)
    whole = host.forward_backward("a", sft_batch(host), "cross_entropy")
    grads = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    monkeypatch.setattr(batches, "LOGITS_BUDGET", 1)  # one datum a chunk
    vocab = host.limits.vocab_size
    assert [len(c) for c in batches.micro_batches(sft_batch(host), vocab)] == [1, 1, 1]
    split = host.forward_backward("a", sft_batch(host), "cross_entropy")
    assert split.metrics["loss:sum"] == pytest.approx(whole.metrics["loss:sum"], abs=1e-4)
    for a, b in zip(split.loss_fn_outputs, whole.loss_fn_outputs, strict=True):
        assert a["logprobs"] == pytest.approx(b["logprobs"], abs=1e-5)
    for p, g in zip(params, grads, strict=True):
        assert torch.allclose(p.grad, g, atol=1e-5)
