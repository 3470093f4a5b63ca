"""The paged engine's draw: the engine's one kernel (`draw.draw`) run inside transformers'
continuous batching, so paged rollouts sample what the reference and fast decoders sample.

transformers' `ContinuousBatchingManager` applies per-request logits processors
(`ContinuousBatchingLogitsProcessor`: each prepares one int32 argument per request from the
request's state, then processes the batch's logits with those arguments), then takes the argmax
when it does not sample. `RowDraw` is such a processor: its argument is the request's (row,
step) cell, which names the row's seeded uniform for that step (`seeded_noise`, the same
uniforms the other decoders draw with); it draws the token with `draw.draw` and answers logits
that are -inf everywhere but there, so the manager's argmax takes our token. The token's
log-prob under softmax(logits / T) (what the other decoders keep) is written to a table, cell
by cell, as it is drawn.

The manager builds its processor list from the generation config alone; the one way in is the
list it holds (`manager.logit_processor`), replaced before its generation thread starts (the
thread's batch processor reads it when it is built). Tables are allocated once per manager and
filled in place, so a captured CUDA graph keeps reading the live ones.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import LogitsProcessorList
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
    ContinuousBatchingLogitsProcessorList,
)
from transformers.generation.continuous_batching.requests import FutureRequestState

from workers.grpo.draw import RowSettings, draw


class RowDraw(ContinuousBatchingLogitsProcessor):
    """The draw of one manager: uniforms and log-probs in (rows, steps) tables, one extra cell
    (the last) for what is not one of the batch's rows (the manager's warm-up, padding)."""

    supported_kwargs: dict[str, type] = {}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self, rows: int, steps: int, device: torch.device) -> None:
        self.rows, self.steps = rows, steps
        self.scratch = rows * steps  # the extra cell's flat index
        self.noise = torch.ones(self.scratch + 1, device=device)  # (R * T + 1,)
        self.logprobs = torch.zeros(self.scratch + 1, device=device)  # (R * T + 1,)
        self.row_of: dict[str, int] = {}
        self.settings = RowSettings.uniform(1.0, 0, 1.0, 1, device)

    def fits(self, rows: int, steps: int) -> bool:
        return rows <= self.rows and steps <= self.steps

    def begin(self, requests: list[str], noise: Tensor, settings: RowSettings) -> None:
        """Draw the requests' tokens (request i is row i) with `noise` (rows, steps) and
        `settings`, one setting for every row (`RowSettings.uniform`: it reads alike for any
        number of rows)."""
        rows, steps = noise.shape
        self.row_of = {request: row for row, request in enumerate(requests)}
        cells = self.noise[: self.scratch].view(self.rows, self.steps)  # (R, T)
        cells[:rows, :steps].copy_(noise)
        self.logprobs.zero_()
        self.settings = settings

    def kept_logprobs(self, rows: int, steps: int) -> Tensor:
        """The drawn tokens' log-probs (rows, steps), 0 where nothing was drawn."""
        return self.logprobs[: self.scratch].view(self.rows, self.steps)[:rows, :steps].clone()

    def fill_defaults(self, int32_tensor: Tensor) -> None:
        int32_tensor.fill_(self.scratch)

    def prepare_tensor_args(self, requests_with_new_token: list[FutureRequestState]) -> Tensor:
        """Each request's cell: its row and the step of the token it draws now."""
        cells = []
        for request in requests_with_new_token:
            row = self.row_of.get(request.state.request_id)
            step = len(request.state.generated_tokens)
            ok = row is not None and step < self.steps
            cells.append(row * self.steps + step if ok and row is not None else self.scratch)
        return torch.tensor(cells, dtype=torch.int32)

    def __call__(self, scores: Tensor, tensor_arg: Tensor) -> Tensor:
        cells = tensor_arg[: scores.shape[0]].long()  # (N,)
        token, logprob = draw(scores, self.settings, self.noise[cells], keep=True)  # (N,), (N,)
        self.logprobs[cells] = logprob
        return torch.full_like(scores, float("-inf")).scatter_(1, token.unsqueeze(1), 0.0)


class RowDrawList(ContinuousBatchingLogitsProcessorList):
    """The manager's processor list holding `RowDraw` alone, with the one int32 argument row it
    needs (transformers counts rows only for the warpers it converts itself)."""

    def __init__(self, row_draw: RowDraw) -> None:
        super().__init__(LogitsProcessorList([row_draw]), drop_unsupported_processors=False)
        self.tensors_required = 1
