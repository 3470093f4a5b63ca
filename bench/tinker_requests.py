"""Tinker API throughput (issue 35): requests/s and step latency for 1 vs N concurrent runs on one
base model, through the official `tinker` SDK against a real API and one tinker worker (CPU).

    .venv/bin/python bench/tinker_requests.py [--runs 1,4] [--steps 8] [--tokens 64] [--batch 4]

Starts `grpo-service api` and `grpo-service tinker-worker` on a fresh SQLite data directory
with the tiny model (workers/grpo/tiny_model.py) in the catalog. Each run belongs to a tenant
of its own, drives `forward_backward` (cross_entropy, `--batch` data of `--tokens` tokens) then
`optim_step` per step from a thread of its own, and waits for both before the next step. A step
is two requests; requests/s counts every request of every run over the whole wall time; a
step's latency is from its submission to its optim_step's result. One warm-up step per run is
not counted (the worker loads the model and creates the run there).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def start(data: Path, port: int) -> tuple[dict[str, str], list[subprocess.Popen[bytes]]]:
    env = {**os.environ, "GRPO_DATA_DIR": str(data), "GRPO_TINKER_WORKER_POLL_S": "0.05"}
    cli = [sys.executable, "-m", "service.cli"]
    subprocess.run([*cli, "migrate"], env=env, check=True, capture_output=True)
    procs = [
        subprocess.Popen([*cli, "api", "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL),
        subprocess.Popen([*cli, "tinker-worker", "--device", "cpu"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    ]  # fmt: skip
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return env, procs
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError("the API did not start")


@contextmanager
def serving(tenants: int) -> Iterator[tuple[str, list[str]]]:
    """The API and a tinker worker on a fresh data directory with the tiny model as `tiny`:
    their base URL and one key per tenant (`bench-0`, `bench-1`...)."""
    from workers.grpo.tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model(Path(tmp) / "tiny", seed=0)
        port = 18000 + os.getpid() % 1000
        env, procs = start(Path(tmp) / "data", port)
        try:
            yield f"http://127.0.0.1:{port}", setup(env, model, tenants)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=30)


def setup(env: dict[str, str], model: Path, tenants: int) -> list[str]:
    """The catalog model and one key per tenant, as `models add` and `create-api-key` do."""
    os.environ.update({k: v for k, v in env.items() if k.startswith("GRPO_")})
    from service.auth.service import new_api_key
    from service.catalog.inspect import inspect_model
    from service.catalog.service import add_model
    from service.core.db import session_scope
    from service.settings import get_settings
    from service.storage import open_storage_from_settings

    facts = inspect_model(model, "local")
    with session_scope() as session:
        add_model(session, open_storage_from_settings(get_settings()), "tiny", str(model), facts)
    keys = []
    for i in range(tenants):
        with session_scope() as session:
            keys.append(new_api_key(session, f"bench-{i}")[1])
    return keys


def drive(base_url: str, keys: list[str], steps: int, tokens: int, batch: int) -> dict:
    import tinker
    from tinker import types

    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints([(7 * i + j) % 90 + 5 for j in range(tokens)]),
            loss_fn_inputs={"target_tokens": [(7 * i + j + 1) % 90 + 5 for j in range(tokens)]},
        )
        for i in range(batch)
    ]
    adam = types.AdamParams(learning_rate=1e-3)
    trainers = []
    for key in keys:
        client = tinker.ServiceClient(base_url=base_url, api_key="tml-" + key)
        trainer = client.create_lora_training_client(base_model="tiny", rank=16).result()
        trainer.forward_backward(data, "cross_entropy").result()  # warm-up
        trainer.optim_step(adam).result()
        trainers.append(trainer)
    latencies: list[float] = []
    lock = threading.Lock()

    def loop(trainer: object) -> None:
        for _ in range(steps):
            start = time.perf_counter()
            fb = trainer.forward_backward(data, "cross_entropy")  # type: ignore[attr-defined]
            opt = trainer.optim_step(adam)  # type: ignore[attr-defined]
            fb.result()
            opt.result()
            with lock:
                latencies.append(time.perf_counter() - start)

    threads = [threading.Thread(target=loop, args=(t,)) for t in trainers]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - began
    latencies.sort()
    return {
        "runs": len(keys),
        "requests_per_s": 2 * steps * len(keys) / wall,
        "steps_per_s": steps * len(keys) / wall,
        "step_latency_median_s": statistics.median(latencies),
        "step_latency_p90_s": latencies[int(0.9 * (len(latencies) - 1))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default="1,4")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    counts = [int(n) for n in args.runs.split(",")]
    with serving(max(counts)) as (base_url, keys):
        for n in counts:
            row = drive(base_url, keys[:n], args.steps, args.tokens, args.batch)
            print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row.items()), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
