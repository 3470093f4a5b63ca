"""CPU weight layout: linear weights column-major, same values, same training, plain checkpoints."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.workers.grpo.helpers import small_spec
from workers.grpo.backend import select_backend
from workers.grpo.device import use_cpu_weight_layout
from workers.grpo.policy import load_policy


def test_linear_weights_become_column_major_with_the_same_values(tiny_model, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor([[1, 40, 41, 42, 43]])
    logits_before = model(ids).logits
    use_cpu_weight_layout(model)
    q = model.model.layers[0].self_attn.q_proj.weight
    assert q.stride() == (1, q.shape[0]) and not q.is_contiguous()
    assert model.get_input_embeddings().weight.is_contiguous()  # tied to the LM head: rows kept
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    torch.testing.assert_close(model(ids).logits, logits_before, rtol=1e-5, atol=1e-5)
    # gradients and the fused AdamW state follow the layout; checkpoints load back equal
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    model(ids).logits.logsumexp(-1).sum().backward()
    assert q.grad.stride() == q.stride()
    optimizer.step()
    model.save_pretrained(tmp_path / "ckpt")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
    for name, value in loaded.state_dict().items():
        assert value.is_contiguous() and torch.equal(value, model.state_dict()[name]), name


def _prepared(spec):
    """The policy as a run lays it out: loaded, then prepared by its backend."""
    policy = load_policy(spec, "cpu")
    backend = select_backend(policy.model, spec.grpo)
    for model in {id(m): m for m in (policy.model, policy.reference) if m is not None}.values():
        backend.prepare(model)
    return policy


def test_the_policy_is_column_major_only_where_it_decodes_through_its_own_forward(
    tiny_model, tmp_path
):
    full = _prepared(small_spec(tiny_model))  # the lean decoder packs its weights
    for m in (full.model, full.reference):
        q = m.model.layers[0].self_attn.q_proj.weight
        assert q.is_contiguous()
    lora = _prepared(small_spec(tiny_model, spec={"lora": {"r": 2}}))  # lean, merged
    q = lora.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    assert q.is_contiguous()
    gelu = AutoModelForCausalLM.from_pretrained(tiny_model)  # not the lean forward's: HF decodes
    gelu.config.hidden_act = "gelu"
    gelu.save_pretrained(tmp_path / "gelu")
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(tmp_path / "gelu")
    own = _prepared(small_spec(tmp_path / "gelu"))
    q = own.model.model.layers[0].self_attn.q_proj.weight
    assert q.stride() == (1, q.shape[0])
