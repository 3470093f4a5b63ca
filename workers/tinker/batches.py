"""A forward / forward_backward's data in micro-batches: consecutive data run as one padded
batch, their losses' backwards adding up to the whole batch's gradients (the loss is a sum).

Two bounds: the padded logits (rows x longest x vocabulary) stay under LOGITS_BUDGET elements,
since a large vocabulary's logits are most of a pass's memory; and the padded tokens under
MICRO_BATCH_TOKENS, since a request's time limit is checked between micro-batches
(`types.Deadline`): this bounds how far past its limit a request runs. A datum longer than
either is a micro-batch alone. No torch here.
"""

from __future__ import annotations

from workers.tinker.types import Datum

LOGITS_BUDGET = 2**28  # logits of one forward (1 GiB in fp32)
MICRO_BATCH_TOKENS = 4096


def micro_batches(data: list[Datum], vocab_size: int) -> list[list[Datum]]:
    chunks: list[list[Datum]] = [[]]
    width = 0
    for datum in data:
        wider = max(width, len(datum.tokens))
        padded = (len(chunks[-1]) + 1) * wider
        if chunks[-1] and (padded > MICRO_BATCH_TOKENS or padded * vocab_size > LOGITS_BUDGET):
            chunks.append([])
            wider = len(datum.tokens)
        chunks[-1].append(datum)
        width = wider
    return chunks
