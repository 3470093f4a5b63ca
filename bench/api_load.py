"""API load benchmark: job-status polling and job creation against a production-mode API,
measured beside its floor.

Starts everything itself: a fresh PostgreSQL database, `grpo-service api --workers N`
(uvicorn's own worker processes; Redis broker on a db number of its own, local object
storage), one tenant, and beside it the floor: a bare FastAPI route (`bench/bare_app.py`, the
same response bytes) served by uvicorn the same way (N workers, the same HTTP protocol and
limits). Then, for each phase, keeps C keep-alive connections busy for D seconds with a small
asyncio HTTP/1.1 client (no third-party load tool needed) and prints requests/s, p50/p99
latency, errors and 5xx answers (a `Connection: close` answer is no error: the client
reconnects, as any does), the API's CPU per request and its RSS (all processes) at start and
end. API CPU ms per request depends far less on the machine's other load than requests/s.

    .venv/bin/python bench/api_load.py --seconds 60 --workers 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.process_stats import connections_per_process, cpu_seconds, rss_mib  # noqa: E402
from service.http.http_limits import uvicorn_options  # noqa: E402

PG = "postgresql+psycopg://postgres@127.0.0.1:5432"
MORE_KEYS = """
import sys
from service.auth.service import new_api_key
from service.core.db import session_scope
with session_scope() as session:
    print(*(new_api_key(session, f"bench-{i}", "full")[1] for i in range(int(sys.argv[1]))))
"""
ROOT = Path(__file__).resolve().parent.parent


def psql(sql: str) -> None:
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-qc", sql], check=True
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} did not answer")
        time.sleep(0.3)


@dataclass
class Stats:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    server_errors: int = 0  # 5xx answers
    reconnects: int = 0
    statuses: dict[int, int] = field(default_factory=dict)


@dataclass
class Answer:
    status: int
    close: bool  # `Connection: close`: the server ends the connection after this answer


async def _read_response(reader: asyncio.StreamReader) -> Answer:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length, close = 0, False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
        elif name.lower() == b"connection":
            close = b"close" in value.lower()
    if length:
        await reader.readexactly(length)
    return Answer(status, close)


async def worker(host: str, port: int, request: bytes, ok: int, until: float, stats: Stats) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < until:
            started = time.perf_counter()
            writer.write(request)
            try:
                answer = await _read_response(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                stats.errors += 1
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
                continue
            stats.latencies.append(time.perf_counter() - started)
            stats.statuses[answer.status] = stats.statuses.get(answer.status, 0) + 1
            if answer.status != ok:
                stats.errors += 1
            if answer.status >= 500:
                stats.server_errors += 1
            if answer.close:  # as any HTTP/1.1 client: the next request on a new connection
                writer.close()
                stats.reconnects += 1
                reader, writer = await asyncio.open_connection(host, port)
    finally:
        writer.close()


def job_spec(client: httpx.Client) -> dict[str, object]:
    """A job of the tiny model on a dataset and verifier of the client's tenant, made here."""
    client.post(
        "/v1/verifiers",
        json={"name": "em", "kind": "exact_match", "config": {"field": "answer"}},
    ).raise_for_status()
    records = [{"prompt": f"Digit {i}:", "answer": str(i)} for i in range(10)]
    ds = client.post("/v1/datasets", json={"name": "d", "records": records})
    ds.raise_for_status()
    return {
        "base_model": "tiny",
        "dataset": ds.json()["id"],
        "verifiers": [{"name": "em"}],
        "queue": "bench-nobody-listens",  # stays queued: no worker trains in the bench
    }


def build_request(method: str, path: str, host: str, key: str, body: bytes | None = None) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: {host}",
        f"Authorization: Bearer {key}",
        "Accept: application/json",
    ]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


async def phase(
    name: str, port: int, request: bytes | list[bytes], ok: int, seconds: float,
    connections: int, pid: int, ramp_s: float = 0.0,
) -> dict[str, float]:  # fmt: skip
    """`request` each connection sends; a list: connection i sends the i-th (round robin)."""
    requests = request if isinstance(request, list) else [request]
    stats = Stats()
    rss_start, cpu_start = rss_mib(pid), cpu_seconds(pid)
    started = time.perf_counter()
    until = started + seconds

    async def count_shares() -> list[int]:
        await asyncio.sleep(min(1.0, seconds / 2))  # every connection open by then
        return connections_per_process(pid, port)

    async def client(i: int) -> None:  # opened one after another over `ramp_s` seconds
        await asyncio.sleep(ramp_s * i / connections)
        await worker("127.0.0.1", port, requests[i % len(requests)], ok, until, stats)

    *_, shares = await asyncio.gather(*(client(i) for i in range(connections)), count_shares())
    elapsed = time.perf_counter() - started
    lat = sorted(stats.latencies)
    result = {
        "requests": len(lat),
        "rps": len(lat) / elapsed,
        "p50_ms": lat[len(lat) // 2] * 1000 if lat else float("nan"),
        "p99_ms": lat[int(len(lat) * 0.99)] * 1000 if lat else float("nan"),
        "errors": stats.errors,
        "5xx": stats.server_errors,
        "reconnects": stats.reconnects,
        "rss_start_mib": rss_start,
        "rss_end_mib": rss_mib(pid),
        "api_cpu_ms_per_request": (cpu_seconds(pid) - cpu_start) * 1000 / max(1, len(lat)),
        "connections_per_process": shares,
    }
    print(
        f"{name:22s} {result['rps']:8.0f} req/s  p50 {result['p50_ms']:6.1f} ms  "
        f"p99 {result['p99_ms']:6.1f} ms  errors {stats.errors}  5xx {stats.server_errors}  "
        f"statuses {stats.statuses}  "
        f"reconnects {stats.reconnects}  "
        f"RSS {rss_start:.0f} -> {result['rss_end_mib']:.0f} MiB  "
        f"API CPU {result['api_cpu_ms_per_request']:.2f} ms/req  "
        f"connections per process {'/'.join(map(str, shares))}",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="Length of each phase.")
    parser.add_argument("--workers", type=int, default=2, help="uvicorn worker processes.")
    parser.add_argument("--connections", type=int, default=32, help="Concurrent connections.")
    parser.add_argument("--redis-db", type=int, default=13, help="Redis db number to use.")
    parser.add_argument(
        "--rate-limit",
        type=int,
        default=0,
        help="GRPO_RATE_LIMIT_PER_MINUTE of the API (0: off); set it high to measure its cost.",
    )
    parser.add_argument(
        "--ramp-s",
        type=float,
        default=0.0,
        help="Open each phase's connections one after another over this many seconds (0: all "
        "at once): as clients arriving one by one rather than together.",
    )
    parser.add_argument(
        "--tenants",
        type=int,
        default=1,
        help="Also run the creation phase with the connections spread over this many tenants "
        "(connection i submits as tenant i mod N): one tenant's submissions commit one at a "
        "time (its exact open-jobs limit), different tenants' side by side.",
    )
    parser.add_argument("--json", type=Path, help="Also write the results here.")
    args = parser.parse_args()

    db = f"grpo_bench_{secrets.token_hex(4)}"
    work = Path(tempfile.mkdtemp(prefix="grpo-bench-"))
    port = free_port()
    redis.Redis(host="127.0.0.1", port=6379, db=args.redis_db).flushdb()
    env = {
        **os.environ,
        "GRPO_DATA_DIR": str(work),
        "GRPO_DATABASE_URL": f"{PG}/{db}",
        "GRPO_BROKER_URL": f"redis://127.0.0.1:6379/{args.redis_db}",
        "GRPO_STORAGE_URL": f"file://{work / 'objects'}",
        "GRPO_MAX_OPEN_JOBS_PER_TENANT": str(10**9),
        "GRPO_QUEUES": '{"gpu": {}, "bench-nobody-listens": {}}',
        "GRPO_RATE_LIMIT_PER_MINUTE": str(args.rate_limit),
    }
    psql(f"CREATE DATABASE {db}")
    api = bare = None

    # The API as `grpo-service api --workers N` runs it; the bare app by uvicorn the same way.
    api_command = [
        sys.executable, "-m", "service.cli", "api", "--port", str(port),
        "--workers", str(args.workers),
    ]  # fmt: skip

    def bare_command(bare_port: int) -> list[str]:
        return [
            sys.executable, "-m", "uvicorn", "bench.bare_app:app", "--port", str(bare_port),
            "--workers", str(args.workers), "--no-access-log", *uvicorn_options(),
        ]  # fmt: skip

    try:
        cli = [sys.executable, "-m", "service.cli"]
        subprocess.run([*cli, "migrate"], env=env, check=True, capture_output=True, cwd=ROOT)
        subprocess.run(  # the job's base model: a tiny one, registered in the catalog
            [*cli, "make-tiny-model", str(work / "tiny"), "--register", "tiny"],
            env=env, check=True, capture_output=True, cwd=ROOT,
        )  # fmt: skip
        out = subprocess.run(
            [*cli, "create-api-key", "--tenant", "bench"],
            env=env, check=True, capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
        key = out.stdout.strip().splitlines()[-1]
        others = subprocess.run(  # one process for all: a key costs a migrate-free session
            [sys.executable, "-c", MORE_KEYS, str(args.tenants - 1)],
            env=env, check=True, capture_output=True, text=True, cwd=ROOT,
        ).stdout.split()  # fmt: skip
        api = subprocess.Popen(api_command, env=env, cwd=ROOT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"})
        deadline = time.monotonic() + 60
        while True:
            try:
                if client.get("/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("API did not become ready")
            time.sleep(0.3)
        spec = job_spec(client)
        job = client.post("/v1/jobs", json=spec).json()
        bare_port = free_port()
        bare = subprocess.Popen(
            bare_command(bare_port),
            env={**env, "BENCH_BARE_BODY": client.get(f"/v1/jobs/{job['id']}").text},
            cwd=ROOT, start_new_session=True,
        )  # fmt: skip
        wait_up(f"http://127.0.0.1:{bare_port}/bare")
        host = f"127.0.0.1:{port}"
        print(
            f"API: {args.workers} processes on PostgreSQL; {args.connections} "
            f"connections, {args.seconds:.0f} s per phase, {os.cpu_count()} CPUs",
            flush=True,
        )
        poll = build_request("GET", f"/v1/jobs/{job['id']}", host, key)
        floor = build_request("GET", "/bare", f"127.0.0.1:{bare_port}", key)
        create = build_request("POST", "/v1/jobs", host, key, json.dumps(spec).encode())
        spread = [create]
        for other in others:
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {other}"}) as c:
                body = json.dumps(job_spec(c)).encode()
            spread.append(build_request("POST", "/v1/jobs", host, other, body))

        n, ramp = args.connections, args.ramp_s

        async def run() -> dict[str, dict[str, float]]:
            # a short warm-up so every worker has its connections and caches
            await phase("warm-up", port, poll, 200, 3, args.connections, api.pid)
            await phase("warm-up bare", bare_port, floor, 200, 3, args.connections, bare.pid)
            floor_run = await phase(
                "bare route", bare_port, floor, 200, args.seconds, n, bare.pid, ramp
            )
            polls = await phase("status polls", port, poll, 200, args.seconds, n, api.pid, ramp)
            polls["of_bare_rps"] = polls["rps"] / floor_run["rps"]
            print(f"status polls at {polls['of_bare_rps']:.0%} of the bare route's rate")
            creates = await phase("job creation", port, create, 201, args.seconds, n, api.pid, ramp)
            results = {"bare_route": floor_run, "status_polls": polls, "job_creation": creates}
            if len(spread) > 1:
                results["job_creation_tenants"] = await phase(
                    f"creation, {len(spread)} tenants", port, spread, 201, args.seconds, n,
                    api.pid, ramp,
                )  # fmt: skip
            return results

        results = asyncio.run(run())
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
    finally:
        for proc in (api, bare):
            if proc is not None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
        psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        redis.Redis(host="127.0.0.1", port=6379, db=args.redis_db).flushdb()


if __name__ == "__main__":
    main()
