"""Webhook delivery latency: event committed -> the receiver has it.

Starts the embedded service (`grpo-service up`: API, worker, reconciler and webhook
dispatcher) and a local receiver on 127.0.0.1 (so GRPO_WEBHOOK_ALLOW_PRIVATE=true), then
queues N test deliveries one at a time, at random gaps (so they fall anywhere in the
dispatcher's poll period). Latency = the receiver's arrival time - the moment the
`POST /v1/webhooks/{id}/test` answer came back (its transaction committed before the answer
was sent, so this slightly under-counts by the answer's trip). Prints p50/p99/max.
Usage: python bench/webhook_latency.py [--n 50] [--poll 1.0]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.e2e.services import run_service  # noqa: E402
from tests.e2e.webhook_receiver import run_receiver  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--poll", type=float, default=1.0, help="GRPO_WEBHOOK_POLL_S")
    args = parser.parse_args()
    env = {"GRPO_WEBHOOK_ALLOW_PRIVATE": "true", "GRPO_WEBHOOK_POLL_S": str(args.poll)}
    rng = random.Random(0)
    with (
        tempfile.TemporaryDirectory() as work,
        run_receiver() as receiver,
        run_service(env, Path(work), embedded=True) as svc,
    ):
        client = svc.client(svc.new_key("bench"))
        hook = client.post(
            "/v1/webhooks", json={"url": f"{receiver.base_url}/bench", "events": ["*"]}
        ).json()
        latencies = []
        for i in range(args.n):
            time.sleep(rng.uniform(0, args.poll))
            r = client.post(f"/v1/webhooks/{hook['id']}/test")
            committed = time.time()
            assert r.status_code == 202, r.text
            got = receiver.wait_for(lambda g, n=i + 1: len(g) >= n, timeout=30)
            latencies.append(got[i].at - committed)
    ms = [1000 * x for x in latencies]
    print(f"webhook delivery latency over {args.n} deliveries, poll {args.poll} s:")
    print(
        f"  p50 {percentile(ms, 0.5):.0f} ms  p99 {percentile(ms, 0.99):.0f} ms  "
        f"max {max(ms):.0f} ms  mean {statistics.fmean(ms):.0f} ms"
    )


if __name__ == "__main__":
    main()
