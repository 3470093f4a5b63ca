"""How long one tenant's small Tinker request waits behind another tenant's big one (issue 46
item 2), through the official `tinker` SDK against a real API and one tinker worker (CPU).

    .venv/bin/python bench/tinker_fairness.py [--data 150] [--tokens 1000]

Starts `grpo-service api` and `grpo-service tinker-worker` on a fresh SQLite data directory with
the tiny model (workers/grpo/tiny_model.py) in the catalog, and two tenants. Tenant b calls
`forward_backward` with `--data` data of `--tokens` tokens (cross_entropy); once b's first
request is running, tenant a calls `forward_backward` on one datum of 8 tokens. Reports a's wait
(from its call to its result), b's whole call, and how many requests the SDK made of b's call
(the server's `client/config` has it split a call over the per-request caps, docs/tinker.md).
Both tenants have run one small warm-up request first (the worker loads the model there).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.tinker_requests import serving  # noqa: E402


def datum(tokens: int, shift: int = 0):  # noqa: ANN201 - tinker.types.Datum
    from tinker import types

    ids = [(7 * j + shift) % 90 + 5 for j in range(tokens + 1)]
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:]},
    )


def wait_running(tenant: str) -> None:
    """Until one of `tenant`'s forward_backward requests is running (read in the database)."""
    from sqlalchemy import select

    from service.core.db import session_scope
    from service.models import Tenant, TinkerRequest

    while True:
        with session_scope() as session:
            running = session.scalar(
                select(TinkerRequest.seq)
                .join(Tenant, Tenant.id == TinkerRequest.tenant_id)
                .where(Tenant.name == tenant, TinkerRequest.status == "running")
            )
        if running is not None:
            return
        time.sleep(0.05)


def requests_of(tenant: str) -> int:
    from sqlalchemy import func, select

    from service.core.db import session_scope
    from service.models import Tenant, TinkerRequest

    with session_scope() as session:
        return int(
            session.scalar(
                select(func.count())
                .select_from(TinkerRequest)
                .join(Tenant, Tenant.id == TinkerRequest.tenant_id)
                .where(Tenant.name == tenant, TinkerRequest.kind == "forward_backward")
            )
            or 0
        )


def measure(base_url: str, keys: list[str], data: int, tokens: int) -> dict[str, float]:
    import tinker

    a_client, b_client = (tinker.ServiceClient(base_url=base_url, api_key="tml-" + k) for k in keys)
    a = a_client.create_lora_training_client(base_model="tiny", rank=8).result()
    b = b_client.create_lora_training_client(base_model="tiny", rank=8).result()
    for trainer in (a, b):  # warm-up: the model loads, each run is created
        trainer.forward_backward([datum(8)], "cross_entropy").result()
    b_before = requests_of("bench-1")
    began = time.perf_counter()
    big = b.forward_backward([datum(tokens, i) for i in range(data)], "cross_entropy")
    wait_running("bench-1")
    a_began = time.perf_counter()
    a.forward_backward([datum(8)], "cross_entropy").result()
    a_wait = time.perf_counter() - a_began
    out = big.result()
    b_total = time.perf_counter() - began
    assert len(out.loss_fn_outputs) == data
    return {"a_wait_s": a_wait, "b_call_s": b_total,
            "b_requests": requests_of("bench-1") - b_before}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=int, default=150)
    parser.add_argument("--tokens", type=int, default=1000)
    args = parser.parse_args()
    with serving(2) as (base_url, keys):
        row = measure(base_url, keys, args.data, args.tokens)
    print(f"b: {args.data} data x {args.tokens} tokens in {row['b_requests']:.0f} request(s), "
          f"{row['b_call_s']:.1f} s; a's one datum waited {row['a_wait_s']:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
