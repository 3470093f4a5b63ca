"""`make demo`'s client side: what a user does over HTTP once the service runs (the verifier and
the datasets, held-out evaluations, the job with a live bar) and the table that ends the demo.
`service/demo.py` starts the service and calls these in order."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from service.demo_task import addition_split

VERIFIER = "sum"  # the built-in `numeric` kind: no sandbox needed
FINAL = ("succeeded", "failed", "cancelled")
SAMPLES_SHOWN = 3


@dataclass(frozen=True)
class Settings:
    """The demo's knobs (issue 47's run: G = 8, 4 prompts a step, 24 new tokens, lr 1e-5,
    beta 0, 30 steps)."""

    steps: int = 30
    prompts_per_step: int = 4
    group_size: int = 8
    max_new_tokens: int = 24
    learning_rate: float = 1e-5
    held_out: int = 100


@dataclass(frozen=True)
class Measured:
    """A greedy evaluation's pass@1 on the held-out sums and its first samples."""

    accuracy: float
    samples: list[tuple[str, str, bool]]  # (question, completion, correct)


def expect(r: httpx.Response, status: int) -> dict[str, Any]:
    if r.status_code != status:
        raise SystemExit(f"{r.request.method} {r.request.url} -> {r.status_code}: {r.text}")
    return r.json()


def upload_task(client: httpx.Client, settings: Settings) -> tuple[str, str]:
    """The verifier, the training sums and the held-out sums; the two datasets' ids."""
    verifier = {"name": VERIFIER, "kind": "numeric", "config": {"field": "answer"}}
    expect(client.post("/v1/verifiers", json=verifier), 201)
    train, held_out = addition_split(settings.steps * settings.prompts_per_step, settings.held_out)
    ids = []
    for name, records in (("sums-train", train), ("sums-held-out", held_out)):
        jsonl = "".join(json.dumps(r) + "\n" for r in records).encode()
        files = {"file": (f"{name}.jsonl", jsonl)}
        ids.append(expect(client.post("/v1/datasets", data={"name": name}, files=files), 201)["id"])
    return ids[0], ids[1]


def _greedy(settings: Settings) -> dict[str, Any]:
    # top_k 1 is greedy decoding: the generation settings take no temperature 0
    return {"max_new_tokens": settings.max_new_tokens, "top_k": 1}


def evaluate(
    client: httpx.Client, console: Console, model: str, dataset: str, settings: Settings
) -> Measured:
    """Greedy pass@1 of `model` on the held-out dataset, through the service's evaluations."""
    body = {
        "model": model,
        "dataset": dataset,
        "verifiers": [{"name": VERIFIER}],
        "samples_per_prompt": 1,
        "generation": _greedy(settings),
    }
    evaluation = expect(client.post("/v1/evaluations", json=body), 201)
    path = f"/v1/evaluations/{evaluation['id']}"
    with console.status(f"    answering {settings.held_out} held-out sums, greedily"):
        while evaluation["status"] not in FINAL:
            time.sleep(0.5)
            evaluation = expect(client.get(path), 200)
    if evaluation["status"] != "succeeded":
        raise SystemExit(f"evaluation ended {evaluation['status']}: {evaluation['error']}")
    page = expect(client.get(f"{path}/samples", params={"limit": SAMPLES_SHOWN}), 200)["data"]
    samples = [(_question(s["prompt"]), s["completion"].strip(), s["passed"]) for s in page]
    return Measured(evaluation["results"]["pass_at_k"]["1"]["estimate"], samples)


def _question(rendered: str) -> str:
    """The sum asked, out of the prompt as the chat template rendered it."""
    start = rendered.rfind("What is ")
    return rendered[start : rendered.index("?", start) + 1] if start >= 0 else rendered.strip()


def train(
    client: httpx.Client, console: Console, model: str, dataset: str, settings: Settings
) -> dict[str, Any]:
    """Submit the GRPO job and follow it with a bar; the finished job."""
    spec = {
        "base_model": model,
        "dataset": dataset,
        "verifiers": [{"name": VERIFIER}],
        "grpo": {
            "steps": settings.steps,
            "prompts_per_step": settings.prompts_per_step,
            "group_size": settings.group_size,
            "learning_rate": settings.learning_rate,
            "beta": 0.0,
            "seed": 0,
        },
        "generation": {"max_new_tokens": settings.max_new_tokens, "temperature": 1.0},
        "checkpoint_every": settings.steps,  # one checkpoint: the trained model evaluated next
    }
    job = expect(client.post("/v1/jobs", json=spec), 201)
    columns = (
        TextColumn("    [bold]training"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("reward {task.fields[reward]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("train", total=job["total_steps"], reward="-")
        while job["status"] not in FINAL:
            time.sleep(0.5)
            job = expect(client.get(f"/v1/jobs/{job['id']}"), 200)
            reward = (job["latest_metrics"] or {}).get("reward_mean")
            shown = f"{reward:.2f}" if reward is not None else "-"
            progress.update(bar, completed=job["step"], reward=shown)
    if job["status"] != "succeeded":
        raise SystemExit(f"job {job['id']} ended {job['status']}: {job['error']}")
    return job


def reward_ends(client: httpx.Client, job_id: str) -> tuple[float, float]:
    """The mean reward of the first 5 steps and of the last 5."""
    rows = expect(client.get(f"/v1/jobs/{job_id}/metrics"), 200)["data"]
    first, last = rows[:5], rows[-5:]
    return (
        sum(r["reward_mean"] for r in first) / len(first),
        sum(r["reward_mean"] for r in last) / len(last),
    )


def latest_checkpoint(client: httpx.Client, job_id: str) -> str:
    return expect(client.get(f"/v1/jobs/{job_id}/checkpoints"), 200)["data"][-1]["id"]


def print_table(
    console: Console, model: str, before: Measured, after: Measured, rewards: tuple[float, float]
) -> None:
    table = Table(title=f"{model} on two-digit addition, before and after GRPO")
    table.add_column("")
    table.add_column("before", overflow="fold")
    table.add_column("after", overflow="fold")
    table.add_row("held-out accuracy (greedy)", f"{before.accuracy:.2f}", f"{after.accuracy:.2f}")
    table.add_row(
        "training reward (first / last 5 steps)", f"{rewards[0]:.2f}", f"{rewards[1]:.2f}"
    )
    # the same held-out sums, first in the dataset, before and after
    for (question, old, old_ok), (_, new, new_ok) in zip(
        before.samples, after.samples, strict=True
    ):
        table.add_row(question, _answer(old, old_ok), _answer(new, new_ok))
    console.print(table)


def _answer(completion: str, correct: bool) -> Text:
    # Text, not markup: a completion may hold square brackets
    verdict = ("right", "green") if correct else ("wrong", "red")
    return Text.assemble(repr(completion), " ", verdict)
