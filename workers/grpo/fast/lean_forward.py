"""The lean forward over whole sequences (pi_ref / pi_old scoring and the training forward).

The G completions of a group share their prompt: each distinct prompt runs through the layers
once and its completions attend to its keys and values, so a prompt of P tokens costs 1/G of
what it costs in a padded batch. Prompt rows and completion rows form one row set: every linear
map and element-wise op runs once over all of them (in training, one weight-gradient product
for both), and only attention takes them apart. It runs on the model's own parameters (the
maths of `lean.LeanModel`), so autograd gives the exact gradient, the prompt's share summed
over its group. A `tape` (`replay.Replay`) may supply the completion rows' linear outputs.

Completion rows are only the positions that predict a completion token: a completion of
length L feeds L - 1 rows whatever the batch's longest (`fed_index`); the rows after its end
would only feed masked-out tokens (attention is causal: they change nothing before them).
Attention, which needs whole sequences, takes them into a zero-padded (N, T - 1) layout and back.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from workers.grpo.fast.lean import LeanModel, Tape, attention, prompt_mask_4d


def fed_index(lengths: list[int], t: int, device: torch.device) -> Tensor | None:
    """Flat indices (K,) into the N x t completion positions that are fed: every one that
    predicts a completion token (row i's first lengths[i] - 1: position j predicts token
    j + 1), then, row by row, as many past the ends as make K a multiple of 2^(floor(log2 K)
    - 2) (at most a quarter more). None when that is every position. From host-side lengths:
    no device read.

    Why round K: every activation of the forward has K rows, and with K different at every
    step the CPU's malloc keeps growing its heap around the holes that freed activations leave
    (peak RSS grows with exact K; rounded, it stays close to that of one fixed K).
    """
    n = len(lengths)
    needed = (torch.arange(t) < (torch.tensor(lengths) - 1).unsqueeze(1)).flatten()  # (N t,)
    k = sum(max(0, min(length - 1, t)) for length in lengths)
    rounding = 1 << max(0, k.bit_length() - 3)  # 4 sizes an octave
    k = min(n * t, -(-k // rounding) * rounding)
    if k == n * t:
        return None
    needed_first = torch.sort((~needed).to(torch.uint8), stable=True).indices  # (N t,)
    return needed_first[:k].sort().values.to(device, non_blocking=True)  # (K,) in row order


def _sequences(
    z: Tensor, m: int, u: int, n: int, t: int, fed: Tensor | None
) -> tuple[Tensor, Tensor]:
    """z (1, H, M, D) as the U prompts (U, H, P, D) and the N completions (N, H, t, D): its
    first m rows and the rest (split, not sliced: split's backward joins the two grads in one
    copy where each slice's zero-fills a full-size one); `fed` rows placed in a zero-padded
    layout (a completion's rows past its end are never attended to: causal)."""
    h, rest, d = z.shape[1], z.shape[2] - m, z.shape[3]
    prompts, completions = z[0].split([m, rest], 1)  # (H, m, D), (H, K, D)
    if fed is not None:  # (H, N t, D)
        completions = completions.new_zeros(h, n * t, d).index_copy(1, fed, completions)
    return (
        prompts.view(h, u, m // u, d).transpose(0, 1),
        completions.view(h, n, t, d).transpose(0, 1),
    )


def prompt_groups(
    rows: Tensor, groups: list[int] | None, share: bool
) -> tuple[Tensor, Tensor, int | None]:
    """The distinct prompts (U, 2P) of `rows` (N, 2P) (prompt ids, mask), each row's one
    (N,), and G when they are U runs of G consecutive rows each (GRPO's batches), else None.

    `groups` (the host's group index of each row) decides without reading the device; without
    it, equal consecutive rows are found on the device (on CUDA, two waits for the device)."""
    n = rows.shape[0]
    if not share:
        return rows, torch.arange(n, device=rows.device), 1
    if groups is not None:
        starts = [i for i in range(n) if i == 0 or groups[i] != groups[i - 1]]
        runs = {b - a for a, b in zip(starts, [*starts[1:], n], strict=True)}
        boundaries = torch.tensor(starts[1:], dtype=torch.long)
        inverse = torch.bucketize(torch.arange(n), boundaries, right=True)  # (N,)
        index = torch.tensor(starts).to(rows.device, non_blocking=True)  # (U,)
        group = inverse.to(rows.device, non_blocking=True)
        return rows.index_select(0, index), group, runs.pop() if len(runs) == 1 else None
    unique, group = torch.unique_consecutive(rows, dim=0, return_inverse=True)  # (U, 2P), (N,)
    u = unique.shape[0]
    consecutive = torch.arange(u, device=rows.device).repeat_interleave(n // u)
    equal = n % u == 0 and torch.equal(group, consecutive)
    return unique, group, n // u if equal else None


def _after_prompts(prompt: Tensor, completion: Tensor, group: Tensor, size: int | None) -> Tensor:
    """(N, Hk, P + T, D): row r's prompt keys (row group[r] of `prompt`), then its own.

    Groups of equal `size` (GRPO's G completions a prompt) join through an expanded view: its
    backward sums over the group, where indexing's scatters each row's grad back."""
    if size is None:
        return torch.cat([prompt[group], completion], 2)
    u, hk, p, d = prompt.shape
    expanded = prompt.unsqueeze(1).expand(u, size, hk, p, d)  # (U, G, Hk, P, D), no copy
    rows = completion.view(u, size, hk, -1, d)  # (U, G, Hk, T, D)
    return torch.cat([expanded, rows], 3).view(u * size, hk, -1, d)  # (N, Hk, P + T, D)


def lean_logits(
    model: Any,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    share_prompts: bool = True,
    tape: Tape | None = None,
    lengths: list[int] | None = None,
    groups: list[int] | None = None,
) -> tuple[Tensor, Tensor]:
    """Logits (R, V) that predict completion tokens, and their flat positions (R,) in the
    (N, T) completion; differentiable. R = N + K: each row's first token (predicted by its
    prompt's last position), then the K fed completion positions (`fed_index`) row by row.

    With `share_prompts`, rows are grouped by equal consecutive (prompt ids, prompt mask), each
    distinct prompt runs once and its completions attend to its keys and values. The numbers
    are the same up to float summation order, which then depends on how rows are grouped.
    `tape` maps the completion positions' linear maps (a `replay.Replay` of the decode's, made
    with the same `lengths`). `lengths`: the completions' lengths (the mask's row sums) on the
    host; None reads them from `completion_mask`. `groups`: each row's group on the host
    (`sampling.Generation.groups`; a group's rows are consecutive and share their prompt);
    None finds equal consecutive prompts on the device.
    """
    n, p = prompt_ids.shape
    t = completion_ids.shape[1] - 1  # the last token predicts nothing we score: not fed
    device = prompt_ids.device
    weight = model.get_input_embeddings().weight
    autocast = torch.is_autocast_enabled(device.type)
    dtype = torch.get_autocast_dtype(device.type) if autocast else weight.dtype
    lean = LeanModel(model, fuse=False, dtype=dtype)
    rows = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], 1)  # (N, 2P)
    unique, group, size = prompt_groups(rows, groups, share_prompts)  # (U, 2P), (N,)
    u_ids, u_mask = unique[:, :p], unique[:, p:]  # (U, P)
    u_pos = (u_mask.cumsum(1) - 1).clamp(min=0)  # (U, P)
    if lengths is None:
        lengths = completion_mask.sum(1).long().tolist()
    fed = fed_index(lengths, t, device)  # (K,) or None: all N (T - 1)
    c_pos = u_mask.sum(1)[group].unsqueeze(1) + torch.arange(t, device=device)  # (N, T - 1)
    c_pos, c_ids = c_pos.flatten(), completion_ids[:, :t].flatten()  # (N (T - 1),)
    if fed is not None:
        c_pos, c_ids = c_pos[fed], c_ids[fed]  # (K,)
    cos, sin = lean.rope(torch.cat([u_pos.flatten(), c_pos]).unsqueeze(0))  # (1, 1, M, D)
    p_mask = prompt_mask_4d(u_mask)  # (U, 1, P, P)
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()  # (T - 1, T - 1)
    c_mask = torch.cat(  # (N, 1, T - 1, P + T - 1): the prompt's real tokens, then causal
        [u_mask.bool()[group][:, None, None, :].expand(n, 1, t, p), causal.expand(n, 1, t, t)], -1
    )
    # One row set: the U * P prompt rows, then the K fed completion rows. Every linear map and
    # element-wise op runs once over all rows (one weight-gradient product for both); only
    # attention takes them apart.
    u, m = unique.shape[0], unique.shape[0] * p
    tape = tape if t > 0 else None  # one-token completions: no decode step to replay
    x = lean.embedding(torch.cat([u_ids.flatten(), c_ids])).unsqueeze(0)  # (1, M, E)
    for i in range(len(lean.layers)):
        q, k, v = lean.qkv(x, i, cos, sin, tape)  # (1, H|Hk, M, D)
        (qp, qc), (kp, kc), (vp, vc) = (_sequences(z, m, u, n, t, fed) for z in (q, k, v))
        o = [attention(qp, kp, vp, p_mask).flatten(0, 1)]  # (U P, E)
        if t > 0:  # qc, kc, vc: (N, H|Hk, T - 1, D)
            keys, values = (_after_prompts(*kv, group, size) for kv in ((kp, kc), (vp, vc)))
            oc = attention(qc, keys, values, c_mask).flatten(0, 1)  # (N (T - 1), E)
            o.append(oc if fed is None else oc.index_select(0, fed))  # (K, E)
        x = x + lean.linear_map(torch.cat(o).unsqueeze(0), i, "out", tape)  # (1, M, E)
        x = x + lean.mlp(x, i, tape)  # (1, M, E)
    last = x[0, p - 1 : m : p]  # (U, E) each prompt's last position
    hidden = torch.cat([last[group], x[0, m:]])  # (N + K, E)
    # flat (N, T) positions: row i's token 0, then fed position f = i t + j predicts token j + 1
    fed_flat = torch.arange(n * t, device=device) if fed is None else fed  # (K,)
    first = torch.arange(n, device=device) * (t + 1)  # (N,)
    return lean.head(hidden), torch.cat([first, fed_flat + fed_flat // max(t, 1) + 1])
