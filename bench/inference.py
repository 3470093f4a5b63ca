"""Inference benchmark: requests/s and p50/p99 latency of `/v1/completions` on the tiny model,
own backend (`grpo-service serve`), CPU, with 1 and 8 concurrent clients; through the API (as
tenants call it) and straight to serve (the proxy's share is the difference).

Starts `grpo-service up` (API, worker, serve) in a temporary folder with a fresh tiny model in
its catalog, one tenant, then for each phase keeps C clients busy for D seconds, each sending
one request after another (16 new tokens, temperature 1, a short prompt).

    .venv/bin/python bench/inference.py --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "service.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def client_loop(
    url: str, headers: dict[str, str], body: dict, until: float, out: list[float]
) -> int:
    errors = 0
    async with httpx.AsyncClient(headers=headers, timeout=120) as client:
        while time.monotonic() < until:
            started = time.perf_counter()
            r = await client.post(url, json=body)
            if r.status_code == 200:
                out.append(time.perf_counter() - started)
            else:
                errors += 1
    return errors


async def phase(url: str, headers: dict[str, str], body: dict, clients: int, seconds: float):
    latencies: list[float] = []
    started = time.monotonic()
    errors = await asyncio.gather(
        *(client_loop(url, headers, body, started + seconds, latencies) for _ in range(clients))
    )
    elapsed = time.monotonic() - started
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    return len(latencies) / elapsed, pct(0.5), pct(0.99), sum(errors), len(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--clients", default="1,8")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="grpo-bench-inference-"))
    port, serve_port, token = free_port(), free_port(), secrets.token_urlsafe(16)
    env = {**os.environ, "GRPO_DATA_DIR": str(work / "data"), "GRPO_INFERENCE_TOKEN": token}
    env.pop("GRPO_INFERENCE_URL", None)
    subprocess.run([*CLI, "make-tiny-model", str(work / "tiny")], env=env, check=True,
                   capture_output=True)  # fmt: skip
    with (work / "up.log").open("wb") as log:
        args_up = ["up", "--port", str(port), "--serve-port", str(serve_port)]
        up = subprocess.Popen([*CLI, *args_up], env=env, stdout=log, stderr=subprocess.STDOUT,
                              cwd=ROOT)  # fmt: skip
    try:
        api, serve = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{serve_port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                api_up = httpx.get(f"{api}/readyz").status_code == 200
                if api_up and httpx.get(f"{serve}/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        subprocess.run([*CLI, "models", "add", "tiny", str(work / "tiny")], env=env, check=True,
                       capture_output=True)  # fmt: skip
        out = subprocess.run([*CLI, "create-api-key", "--tenant", "bench"], env=env, check=True,
                             capture_output=True, text=True)  # fmt: skip
        key = out.stdout.strip().splitlines()[-1]
        body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": args.max_tokens}
        targets = {
            "API -> serve": (f"{api}/v1/completions", {"Authorization": f"Bearer {key}"}),
            "serve alone": (f"{serve}/v1/completions", {"Authorization": f"Bearer {token}"}),
        }
        for url, headers in targets.values():  # load the model, warm up
            httpx.post(url, json=body, headers=headers, timeout=120).raise_for_status()
        print(f"tiny model, {args.max_tokens} new tokens per request, {args.seconds:g} s a phase")
        print(f"{'path':<14}{'clients':>8}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
              f"{'errors':>8}{'requests':>10}")  # fmt: skip
        for name, (url, headers) in targets.items():
            for clients in (int(c) for c in args.clients.split(",")):
                rps, p50, p99, errors, count = asyncio.run(
                    phase(url, headers, body, clients, args.seconds)
                )
                print(f"{name:<14}{clients:>8}{rps:>9.1f}{p50:>9.1f}{p99:>9.1f}{errors:>8}"
                      f"{count:>10}")  # fmt: skip
        health = httpx.get(f"{serve}/health", headers={"Authorization": f"Bearer {token}"})
        print("serve engine:", health.json()["engine"])
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=60)


if __name__ == "__main__":
    main()
