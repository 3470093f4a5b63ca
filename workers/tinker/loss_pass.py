"""One micro-batch of a Tinker loss pass: the target tokens' log-probs under the active adapter
and the registered loss term on them (`LoraHost.forward` / `forward_backward` sum these)."""

from __future__ import annotations

from typing import Any

import torch

from workers.grpo.logprobs import token_logprobs
from workers.losses.terms import LossFn
from workers.tinker.finite import finite
from workers.tinker.types import Datum


def micro_batch_loss(
    model: Any,  # a transformers causal LM
    chunk: list[Datum],
    term: LossFn,
    tensors: set[str],
    cfg: dict[str, float],
    outputs: list[dict[str, list[float]]],
) -> tuple[torch.Tensor, bool]:
    """The micro-batch's summed loss () and whether its values are finite; each datum's
    log-probs and elementwise loss appended to `outputs`."""
    loss = torch.zeros((), device=model.device)
    ok = True
    for datum, lp in zip(chunk, target_logprobs(model, chunk), strict=True):
        inputs = {k: torch.tensor(v, dtype=torch.float32, device=lp.device)
                  for k, v in datum.loss_fn_inputs.items() if k in tensors}  # fmt: skip
        elementwise = term(lp, inputs, cfg)  # (T,)
        loss = loss + elementwise.sum()
        ok = ok and finite([lp, elementwise])
        outputs.append({"logprobs": lp.detach().tolist(),
                        "elementwise_loss": elementwise.detach().tolist()})  # fmt: skip
    return loss, ok


def target_logprobs(model: Any, data: list[Datum]) -> list[torch.Tensor]:
    """log pi(target_tokens[t] | tokens[:t + 1]) (T_i,) per datum, under the active adapter.
    The batch is right-padded: causal attention keeps each datum's tokens from the pads."""
    width, device = max(len(d.tokens) for d in data), model.device
    ids = torch.zeros(len(data), width, dtype=torch.long)  # (B, L)
    targets = torch.zeros(len(data), width, dtype=torch.long)  # (B, L)
    for i, d in enumerate(data):
        ids[i, : len(d.tokens)] = torch.tensor(d.tokens)
        targets[i, : len(d.tokens)] = torch.tensor(d.loss_fn_inputs["target_tokens"])
    logits = model(input_ids=ids.to(device), use_cache=False).logits  # (B, L, V)
    lp, _ = token_logprobs(logits.flatten(0, 1), targets.to(device).flatten(), 1.0, False)
    lp = lp.view(len(data), width)  # (B, L)
    return [lp[i, : len(d.tokens)] for i, d in enumerate(data)]
