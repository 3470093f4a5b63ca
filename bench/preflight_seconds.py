"""Pre-flight seconds on the tiny model, through the embedded service.

Starts `grpo-service up` (API, worker, reconciler) with the tiny random-init model in its
catalog, a sandboxed python verifier and the digit task, then runs N pre-flights one after
another (4 prompts x 4 completions of at most 8 tokens, the pre-flight's defaults) and prints,
for each: the wall time from `POST /v1/jobs/preflight` to its final state, the time queued
(created -> started, until a worker took it), the time in the pre-flight process (started ->
finished: process start, imports, model load, sandbox, one GRPO step) and the step itself.
Usage: python bench/preflight_seconds.py [--n 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from service.demo_task import digit_records  # noqa: E402
from tests.e2e.services import TINY, run_service  # noqa: E402
from tests.e2e.test_preflight import preflight  # noqa: E402
from workers.grpo.tiny_model import make_tiny_model  # noqa: E402

VERIFIER = (
    "def verify(prompt, completion, **fields):\n"
    "    return float(any(c.isdigit() for c in completion))\n"
)


def prepare(client: httpx.Client) -> dict[str, Any]:
    """The verifier and the dataset; returns the pre-flight's body."""
    verifier = {"name": "has-digit", "kind": "python", "config": {"source": VERIFIER}}
    assert client.post("/v1/verifiers", json=verifier).status_code == 201
    jsonl = "".join(json.dumps(r) + "\n" for r in digit_records(16))
    r = client.post("/v1/datasets", data={"name": "digits"}, files={"file": ("d.jsonl", jsonl)})
    assert r.status_code == 201, r.text
    return {
        "base_model": TINY,
        "dataset": "digits",
        "verifiers": [{"name": "has-digit"}],
        "grpo": {"steps": 3, "prompts_per_step": 8, "group_size": 4, "learning_rate": 1e-3},
        "generation": {"max_new_tokens": 8},
    }


def run_one(client: httpx.Client, body: dict[str, Any]) -> dict[str, float]:
    result, wall = preflight(client, body)  # posts, then follows a 202's Location until final
    assert result["status"] == "succeeded", result
    at = {k: datetime.fromisoformat(result[k]) for k in ("created_at", "started_at", "finished_at")}
    return {
        "wall": wall,
        "queued": (at["started_at"] - at["created_at"]).total_seconds(),
        "process": (at["finished_at"] - at["started_at"]).total_seconds(),
        "step": float(result["step_seconds"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3, help="Pre-flights, one after another.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = make_tiny_model(work / "tiny", seed=0)
        (work / "service").mkdir()
        with run_service({}, work / "service", embedded=True, model=model) as svc:
            client = svc.client(svc.new_key("bench"))
            body = prepare(client)
            runs = [run_one(client, body) for _ in range(args.n)]
    print(f"pre-flight on the tiny model, {args.n} runs (seconds):")
    for i, run in enumerate(runs, 1):
        print("  " + f"run {i}: " + "  ".join(f"{k} {v:.2f}" for k, v in run.items()))
    medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print("  median: " + "  ".join(f"{k} {v:.2f}" for k, v in medians.items()))


if __name__ == "__main__":
    main()
