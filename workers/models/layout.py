"""How a loaded model's weights lie in CPU memory.

On CPU, `use_cpu_weight_layout` can store every linear layer's weight (out, in) column-major:
`F.linear` computes x @ W.T, and with W.T row-major the BLAS runs a plain (NN) product instead of
one with a transposed operand, which is faster for the few-row products of decoding through the
model's own forward. Models the lean decoder covers decode on packed copies instead
(`workers/grpo/fast/lean_decode.py`), and there row-major is better: the fused AdamW step copies
every non-contiguous weight's gradient, and packing reads row-major without a copy. Which layout
a caller uses is its choice (GRPO's `Backend.prepare`, serving column-major). Same values, same
shapes either way; gradients and optimizer state follow the layout; checkpoints are written
contiguous by `save_pretrained`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def use_cpu_weight_layout(model: PreTrainedModel, column_major: bool = True) -> None:
    """With `column_major`, store linear weights so (see the module docstring); embeddings
    keep their rows.

    Every CPU parameter is copied into memory of its own, so the mapping of the checkpoint file
    that `from_pretrained` reads weights through is released: its pages, touched by the copies,
    would otherwise stay in the resident set for the whole run.
    """
    embedding = model.get_input_embeddings()
    tied = embedding.weight if embedding is not None else None
    linear = {
        id(m.weight)
        for m in model.modules()
        if isinstance(m, torch.nn.Linear) and m.weight is not tied and m.weight.dim() == 2
    }
    with torch.no_grad():
        for param in model.parameters():
            if param.device.type != "cpu":
                continue
            if column_major and id(param) in linear and param.is_contiguous():
                param.data = param.data.t().contiguous().t()
            else:
                param.data = param.data.clone()
