from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def test_tiny_model_loads_offline_and_generates(tiny_model: Path) -> None:
    assert (tiny_model / "model.safetensors").exists()
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    assert 2_000_000 < sum(p.numel() for p in model.parameters()) < 4_000_000
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.config.pad_token_id == tokenizer.pad_token_id
    ids = tokenizer("Digit 7:\n", return_tensors="pt")
    assert ids["input_ids"][0, 0].item() == tokenizer.bos_token_id
    assert tokenizer.decode(ids["input_ids"][0], skip_special_tokens=True) == "Digit 7:\n"
    torch.manual_seed(0)
    out = model.generate(**ids, max_new_tokens=5, do_sample=True)
    prompt_len = ids["input_ids"].shape[1]
    assert out.shape[0] == 1 and prompt_len < out.shape[1] <= prompt_len + 5
