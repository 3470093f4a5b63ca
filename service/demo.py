"""`make demo`: a real GRPO job on a tiny model, end to end, through the embedded service.

Starts `grpo-service up`, then acts as a client over HTTP: API key, python verifier, dataset,
job, a progress bar while it trains, checkpoint download (sha256 checked), `from_pretrained`,
a sample completion and the reward of the first vs the last steps; then stops the service.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from service.demo_task import DIGIT_VERIFIER_SOURCE, digit_records
from workers.verifiers import sandbox_mode

console = Console()
ROOT = Path(os.environ.get("GRPO_DEMO_DIR", ".grpo/demo")).resolve()
CLI = [sys.executable, "-m", "service.cli"]
DEMO_MODEL = "tiny-llama"

JOB_SPEC: dict[str, Any] = {
    "grpo": {
        "steps": 30,
        "prompts_per_step": 2,
        "group_size": 8,
        "learning_rate": 2e-3,
        "beta": 0.04,
        "seed": 0,
    },
    "generation": {"max_new_tokens": 16, "temperature": 1.0},
    "checkpoint_every": 10,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_service(env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    log = (ROOT / "service.log").open("wb")
    # The API and a worker: the demo asks nothing of the inference server or the Tinker worker.
    up = [*CLI, "up", "--port", str(port), "--no-serve", "--no-tinker"]
    proc = subprocess.Popen(up, env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the service exited; see {ROOT / 'service.log'}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit("the service did not become ready")


def _expect(r: httpx.Response, status: int) -> dict[str, Any]:
    if r.status_code != status:
        raise SystemExit(f"{r.request.method} {r.request.url} -> {r.status_code}: {r.text}")
    return r.json()


def _follow(client: httpx.Client, job_id: str, total: int) -> dict[str, Any]:
    columns = (
        TextColumn("[bold]training"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("reward {task.fields[reward]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("train", total=total, reward="-")
        while True:
            job = _expect(client.get(f"/v1/jobs/{job_id}"), 200)
            reward = (job["latest_metrics"] or {}).get("reward_mean")
            shown = f"{reward:.3f}" if reward is not None else "-"
            progress.update(task, completed=job["step"], reward=shown)
            if job["status"] in ("succeeded", "failed", "cancelled"):
                return job
            time.sleep(0.5)


def run_demo() -> None:
    started = time.monotonic()
    if sandbox_mode() == "unavailable":  # the demo's verifier is a python one
        console.print(
            "[red]python verifiers run in a bubblewrap sandbox, and bubblewrap is missing or "
            "cannot create namespaces here:[/] run `make demo` as root (it installs it) or "
            "`apt-get install bubblewrap`"
        )
        raise SystemExit(1)
    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir(parents=True)
    env = {
        **os.environ,
        "GRPO_DATA_DIR": str(ROOT / "data"),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    for key in ("GRPO_DATABASE_URL", "GRPO_BROKER_URL", "GRPO_STORAGE_URL"):
        env.pop(key, None)  # the demo always runs the embedded mode

    console.print("[bold]1.[/] building a tiny random-init Llama (~3M parameters)")
    model_dir = ROOT / "tiny-model"
    subprocess.run([*CLI, "make-tiny-model", str(model_dir)], env=env, check=True)

    port = _free_port()
    console.print(f"[bold]2.[/] starting the embedded service on http://127.0.0.1:{port}")
    proc = _start_service(env, port)
    try:
        key = subprocess.run(
            [*CLI, "create-api-key", "--tenant", "demo"],
            env=env, check=True, capture_output=True, text=True,
        ).stdout.strip().splitlines()[-1]  # fmt: skip
        console.print(f"    the operator adds it to the model catalog as '{DEMO_MODEL}'")
        subprocess.run(
            [*CLI, "models", "add", DEMO_MODEL, str(model_dir)],
            env=env, check=True, capture_output=True,
        )  # fmt: skip
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60) as c:
            _client_session(c, model_dir)
    finally:
        console.print("[bold]8.[/] stopping the service")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    console.print(f"demo finished in {time.monotonic() - started:.0f} s")


def _client_session(client: httpx.Client, model_dir: Path) -> None:
    console.print("[bold]3.[/] registering the python verifier 'digits'")
    verifier = {"name": "digits", "kind": "python", "config": {"source": DIGIT_VERIFIER_SOURCE}}
    _expect(client.post("/v1/verifiers", json=verifier), 201)

    jsonl = "".join(json.dumps(r) + "\n" for r in digit_records(64))
    files = {"file": ("digits.jsonl", jsonl.encode())}
    ds = _expect(client.post("/v1/datasets", data={"name": "digits"}, files=files), 201)
    console.print(f"[bold]4.[/] uploaded dataset {ds['id']} ({ds['num_records']} records)")

    spec = {**JOB_SPEC, "base_model": DEMO_MODEL, "dataset": ds["id"]}
    spec["verifiers"] = [{"name": "digits"}]
    job = _expect(client.post("/v1/jobs", json=spec), 201)
    console.print(f"[bold]5.[/] job {job['id']} queued; following it")
    job = _follow(client, job["id"], job["total_steps"])
    if job["status"] != "succeeded":
        raise SystemExit(f"job ended {job['status']}: {job['error']}")

    rows = _expect(client.get(f"/v1/jobs/{job['id']}/metrics"), 200)["data"]
    first = sum(r["reward_mean"] for r in rows[:5]) / len(rows[:5])
    last = sum(r["reward_mean"] for r in rows[-5:]) / len(rows[-5:])
    tps = sorted(r["tokens_per_second"] for r in rows)[len(rows) // 2]

    ckpts = _expect(client.get(f"/v1/jobs/{job['id']}/checkpoints"), 200)["data"]
    archive = ROOT / "checkpoint.tar"
    digest = hashlib.sha256()
    with client.stream("GET", f"/v1/jobs/{job['id']}/checkpoints/latest/download") as r:
        r.raise_for_status()
        with archive.open("wb") as fh:
            for chunk in r.iter_bytes():
                fh.write(chunk)
                digest.update(chunk)
    if digest.hexdigest() != ckpts[-1]["sha256"]:
        raise SystemExit("checkpoint sha256 mismatch")
    console.print(f"[bold]6.[/] downloaded step {ckpts[-1]['step']} to {archive}: sha256 matches")

    out = ROOT / "checkpoint"
    with tarfile.open(archive) as tar:
        tar.extractall(out, filter="data")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    prompt = "Digit 7:"
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    generated = model.generate(ids, max_new_tokens=16, do_sample=False)
    completion = tokenizer.decode(generated[0, ids.shape[1] :], skip_special_tokens=True)
    console.print(
        f"[bold]7.[/] from_pretrained loaded it; greedy sample: {prompt!r} -> {completion!r}"
    )
    console.print(
        f"reward mean: first 5 steps {first:.3f} -> last 5 steps {last:.3f} "
        f"(x{last / max(first, 1e-9):.1f}); median {tps:.0f} completion tokens/s"
    )


if __name__ == "__main__":
    run_demo()
