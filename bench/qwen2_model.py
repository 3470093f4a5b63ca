"""A random-init Qwen2-shaped causal LM for the GPU benchmark (`vs_trl.py --sizes 1.5b`).

The shape is Qwen2.5-1.5B's (hidden 1536, 28 layers, 12 query / 2 key-value heads, MLP 8960,
151,936-token tied embedding, rope theta 1e6, q/k/v biases): 1.54B parameters, written in bf16.
The tokenizer is the tiny model's one-token-per-character one, padded with filler tokens up to
the vocabulary, so the embedding, the head and the logits are the real model's size (the logits
are much of GRPO's memory) while no tokenizer has to be downloaded. Random weights: the figures
are speed and memory, not learning.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, processors
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from workers.grpo.tiny_model import CHARACTERS, SPECIAL_TOKENS


def padded_char_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """One token per character (as `tiny_model.build_char_tokenizer`), then fillers."""
    tokens = [*SPECIAL_TOKENS, *CHARACTERS]
    tokens += [f"<x{i}>" for i in range(vocab_size - len(tokens))]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        unk_token="<unk>", padding_side="left",
    )  # fmt: skip


def make_qwen2_model(
    path: str | Path,
    *,
    hidden_size: int,
    layers: int,
    heads: int,
    kv_heads: int,
    intermediate_size: int,
    vocab_size: int,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """Write the model (initialised on the GPU when there is one: seconds, not minutes)."""
    path = Path(path)
    tokenizer = padded_char_tokenizer(vocab_size)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=4096,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2ForCausalLM(config).to(dtype)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
