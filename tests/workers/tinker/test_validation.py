"""Each bad request raises TinkerInputError naming its field, before touching the model."""

from __future__ import annotations

import pytest

from tests.workers.tinker.conftest import DEVICE, rl_datum, sft_datum
from workers.losses.registry import SPECS
from workers.tinker.types import (
    MAX_LORA_RANK,
    AdamParams,
    Datum,
    LoraConfig,
    SamplingParams,
    TinkerInputError,
)


@pytest.fixture(scope="module")
def host(tiny_model_dir, tmp_path_factory):  # noqa: ANN001, ANN201
    from workers.tinker.host import LoraHost

    host = LoraHost(
        tiny_model_dir, state_dir=tmp_path_factory.mktemp("tinker-state"), device=DEVICE
    )
    host.create_run("a", LoraConfig(rank=4))
    return host


def field_of(call) -> str:  # noqa: ANN001
    with pytest.raises(TinkerInputError) as err:
        call()
    return err.value.field


def with_inputs(datum: Datum, **changes) -> Datum:
    return Datum(list(datum.tokens), {**datum.loss_fn_inputs, **changes})


def test_bad_training_requests_name_their_field(host) -> None:  # noqa: ANN001
    good = sft_datum(host.tokenizer, "hello there")
    n, vocab = len(good.tokens), host.limits.vocab_size
    fb = host.forward_backward
    assert field_of(lambda: fb("a", [good], "nll")) == "loss_fn"
    assert field_of(lambda: fb("zz", [good], "cross_entropy")) == "model_id"
    assert field_of(lambda: fb("a", [], "cross_entropy")) == "data"
    bad = Datum([*good.tokens[:-1], vocab], good.loss_fn_inputs)
    assert field_of(lambda: fb("a", [good, bad], "cross_entropy")) == (
        f"data[1].model_input.tokens[{n - 1}]"
    )
    assert field_of(lambda: fb("a", [Datum([-1] * n, good.loss_fn_inputs)], "cross_entropy")) == (
        "data[0].model_input.tokens[0]"
    )
    short = with_inputs(good, weights=[1.0] * (n - 1))
    assert field_of(lambda: fb("a", [short], "cross_entropy")) == "data[0].loss_fn_inputs.weights"
    oob = with_inputs(good, target_tokens=[vocab + 5] * n)
    assert field_of(lambda: fb("a", [oob], "cross_entropy")) == (
        "data[0].loss_fn_inputs.target_tokens[0]"
    )
    nan = with_inputs(good, weights=[float("nan")] * n)
    assert field_of(lambda: fb("a", [nan], "cross_entropy")) == "data[0].loss_fn_inputs.weights"
    typo = with_inputs(good, wieghts=[1.0] * n)
    assert field_of(lambda: fb("a", [typo], "cross_entropy")) == "data[0].loss_fn_inputs.wieghts"
    assert field_of(lambda: fb("a", [good], "importance_sampling")) == (
        "data[0].loss_fn_inputs.logprobs"
    )
    context = host.limits.context
    long = Datum([5] * (context + 1), {"target_tokens": [5] * (context + 1)})
    assert field_of(lambda: fb("a", [long], "cross_entropy")) == "data[0].model_input"
    rl = rl_datum(host.tokenizer, "hello", 1.0)
    assert field_of(lambda: fb("a", [rl], "ppo", {"clip_lo": 0.9})) == "loss_fn_config.clip_lo"
    assert field_of(lambda: fb("a", [rl], "ppo", {"clip_low_threshold": "x"})) == (
        "loss_fn_config.clip_low_threshold"
    )
    # nothing of the refused requests reached the run: no gradient is pending
    assert all(p.grad is None for p in host.adapters.parameters(host._runs["a"].name))


def test_every_registered_loss_runs_and_each_missing_input_is_named(host) -> None:  # noqa: ANN001
    """The engine's side of tests/service/tinker/test_checks.py: the same inputs, the same field."""
    datum = rl_datum(host.tokenizer, "hello", 1.0)
    n = len(datum.tokens)
    for name, spec in SPECS.items():
        values = {k: datum.loss_fn_inputs.get(k, [1.0] * n) for k in spec.required}
        out = host.forward("a", [Datum(list(datum.tokens), values)], name)
        assert len(out.loss_fn_outputs[0]["elementwise_loss"]) == n
        for missing in spec.required:
            bad = Datum(list(datum.tokens), {k: v for k, v in values.items() if k != missing})
            field = field_of(lambda bad=bad, name=name: host.forward("a", [bad], name))
            assert field == f"data[0].loss_fn_inputs.{missing}"


def test_bad_runs_name_their_field(host) -> None:  # noqa: ANN001
    assert field_of(lambda: host.create_run("b", LoraConfig(rank=0))) == "lora_config.rank"
    too_big = LoraConfig(rank=MAX_LORA_RANK + 1)
    assert field_of(lambda: host.create_run("b", too_big)) == "lora_config.rank"
    bad = LoraConfig(rank=4, target_modules=["q_proj", "qproj"])
    assert field_of(lambda: host.create_run("b", bad)) == "lora_config.target_modules[1]"
    off = LoraConfig(rank=4, train_attn=False, train_mlp=False, train_unembed=False)
    assert field_of(lambda: host.create_run("b", off)) == "lora_config"
    # the tiny model ties its unembedding to its embedding: no adapter may go there
    unembed_only = LoraConfig(rank=4, train_attn=False, train_mlp=False)
    assert field_of(lambda: host.create_run("b", unembed_only)) == "lora_config"
    tied = LoraConfig(rank=4, target_modules=["lm_head"])
    assert field_of(lambda: host.create_run("b", tied)) == "lora_config.target_modules[0]"
    assert field_of(lambda: host.create_run("a", LoraConfig(rank=4))) == "model_id"
    assert field_of(lambda: host.optim_step("b", AdamParams())) == "model_id"
    bad_values = {"learning_rate": -1e-3, "beta1": 1.0, "beta2": float("nan"), "eps": -1.0,
                  "weight_decay": -0.1, "grad_clip_norm": -1.0}  # fmt: skip
    for name, value in bad_values.items():
        bad = AdamParams(**{name: value})
        assert field_of(lambda bad=bad: host.optim_step("a", bad)) == f"adam_params.{name}"
    assert not host.has_run("b")
    host.create_run("b", LoraConfig(rank=4, target_modules=["q_proj", "v_proj"]))
    names = {n.split(".lora_")[0].rsplit(".", 1)[-1]
             for n, _ in host.model.named_parameters() if ".run" in n and n.endswith("weight")
             and host._runs["b"].name in n}  # fmt: skip
    assert names == {"q_proj", "v_proj"}


def test_bad_sampling_requests_name_their_field(host) -> None:  # noqa: ANN001
    ok = SamplingParams(max_tokens=4)
    vocab, context = host.limits.vocab_size, host.limits.context
    s = host.sample
    assert field_of(lambda: s("a", [], 1, ok)) == "prompt"
    assert field_of(lambda: s("a", [1, vocab], 1, ok)) == "prompt.tokens[1]"
    assert field_of(lambda: s("a", [1], 0, ok)) == "num_samples"
    assert field_of(lambda: s("a", [1] * context, 1, ok)) == "prompt"
    too_long = SamplingParams(max_tokens=context)
    assert field_of(lambda: s("a", [1, 2], 1, too_long)) == "sampling_params.max_tokens"
    hot = SamplingParams(max_tokens=4, temperature=-1)
    assert field_of(lambda: s("a", [1], 1, hot)) == "sampling_params.temperature"
    assert field_of(lambda: s("a", [1], 1, SamplingParams(4, top_p=0))) == "sampling_params.top_p"
    assert field_of(lambda: s("a", [1], 1, SamplingParams(4, top_k=0))) == "sampling_params.top_k"
    stop = SamplingParams(4, stop=[vocab])
    assert field_of(lambda: s("a", [1], 1, stop)) == "sampling_params.stop[0]"
    assert field_of(lambda: s("nope", [1], 1, ok)) == "weights"


def test_bad_state_names_path_and_keeps_the_run(host, tmp_path) -> None:  # noqa: ANN001
    import json

    assert field_of(lambda: host.load_state("a", tmp_path / "none")) == "path"
    host.save_state("a", tmp_path / "ok")
    before = host.forward("a", [sft_datum(host.tokenizer, "hello")], "cross_entropy")
    meta = json.loads((tmp_path / "ok" / "run.json").read_text())
    meta["config"]["rank"] = 8  # the saved matrices are rank 4: they cannot load
    (tmp_path / "ok" / "run.json").write_text(json.dumps(meta))
    assert field_of(lambda: host.load_state("a", tmp_path / "ok")) == "path"
    after = host.forward("a", [sft_datum(host.tokenizer, "hello")], "cross_entropy")
    assert after.metrics == before.metrics
    assert host.has_run("a") and all("loading" not in r for r in host._runs)
    assert sorted(host._runs) == sorted(host.resident_runs())
