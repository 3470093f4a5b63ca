"""A tiny random-init Llama with a character-level tokenizer, built offline for tests and demos.

`make_tiny_model(path)` writes a `LlamaForCausalLM` (~3M parameters at the defaults) and a
`PreTrainedTokenizerFast` to `path` with `save_pretrained` (safetensors), so that
`AutoModelForCausalLM.from_pretrained(path)` and `AutoTokenizer.from_pretrained(path)` load it
without a model hub. The vocabulary is one token per printable ASCII character plus newline,
and the specials `<bos>`, `<eos>`, `<pad>`, `<unk>`. It has no chat template unless asked for
one (`chat_template=True`: `role: content` lines after `<bos>`, then `assistant:`).
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARACTERS = [c for c in string.printable if c.isprintable()] + ["\n"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character; prepends `<bos>`; decoding concatenates the characters."""
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *CHARACTERS])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
    )


def make_tiny_model(
    path: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 256,
    layers: int = 4,
    heads: int = 4,
    intermediate_size: int = 512,
    max_position_embeddings: int = 1024,
    chat_template: bool = False,
    dtype: str = "float32",
) -> Path:
    """Write a random-init Llama-shaped causal LM and its tokenizer to `path`; return the path."""
    path = Path(path)
    tokenizer = build_char_tokenizer()
    if chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model = model.to(getattr(torch, dtype))  # saved in it, as a bf16 hub model is
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
