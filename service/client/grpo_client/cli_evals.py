"""`grpo evals`: evaluate a model or checkpoint on a dataset, read the results, and compare
evaluations side by side (reward mean, each verifier's mean, pass@k) (docs/evaluations.md)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from grpo_client.cli_base import JsonOpt, app, client, emit, err, out, table
from grpo_client.models_generated import EvaluationOut

evals_app = typer.Typer(no_args_is_help=True, help="Evaluate models and checkpoints: pass@k.")
app.add_typer(evals_app, name="evals")

EvalArg = Annotated[str, typer.Argument(help="Evaluation id (eval_…).")]


@evals_app.command("create")
def create(
    model: Annotated[str, typer.Option(help="Catalog model, ckpt_… or ft:… name.")],
    dataset: Annotated[str, typer.Option(help="Dataset id or name.")],
    verifier: Annotated[
        list[str], typer.Option("--verifier", "-v", help="A verifier name[:version] (repeat it).")
    ],
    samples_per_prompt: Annotated[
        int, typer.Option("--samples-per-prompt", "-k", help="Completions per record (<= 64).")
    ] = 4,
    max_new_tokens: Annotated[int | None, typer.Option(help="Completion length cap.")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature.")] = None,
    pass_threshold: Annotated[float, typer.Option(help="A sample passes at this reward.")] = 1.0,
    max_records: Annotated[int | None, typer.Option(help="Only the first N records.")] = None,
    queue: Annotated[str, typer.Option(help="The worker queue.")] = "gpu",
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the results.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Queue an evaluation (with --wait, print its results when it ends)."""
    generation = {
        k: v for k, v in {"max_new_tokens": max_new_tokens, "temperature": temperature}.items()
        if v is not None
    }  # fmt: skip
    body: dict[str, Any] = {
        "model": model, "dataset": dataset, "verifiers": [_ref(v) for v in verifier],
        "samples_per_prompt": samples_per_prompt, "generation": generation,
        "pass_threshold": pass_threshold, "queue": queue,
        **({"max_records": max_records} if max_records is not None else {}),
    }  # fmt: skip
    with client() as grpo:
        evaluation = grpo.evaluations.create(body)
        if wait:
            evaluation = grpo.evaluations.wait(evaluation.id)
    emit(evaluation, as_json, lambda e: _show(e) if wait else out.print(f"{e.id} {e.status}"))


def _ref(value: str) -> dict[str, Any]:
    name, _, version = value.partition(":")
    return {"name": name, **({"version": int(version)} if version.isdigit() else {})}


@evals_app.command("get")
def get(evaluation_id: EvalArg, as_json: JsonOpt = False) -> None:
    """An evaluation's status and results."""
    with client() as grpo:
        evaluation = grpo.evaluations.get(evaluation_id)
    emit(evaluation, as_json, _show)


@evals_app.command("list")
def list_(
    limit: Annotated[int, typer.Option(min=1, max=100, help="Most rows shown.")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """Your evaluations, newest first."""
    with client() as grpo:
        found = grpo.evaluations.list(limit=limit).data
    rows = [
        [e.id, e.status, e.model, e.dataset, e.samples_per_prompt,
         _num(e.results.reward_mean) if e.results else "", e.created_at.isoformat()]
        for e in found
    ]  # fmt: skip
    columns = ["id", "status", "model", "dataset", "k", "reward_mean", "created_at"]
    emit(found, as_json, lambda _: out.print(table(columns, rows)))


@evals_app.command("compare")
def compare(
    evaluation_ids: Annotated[list[str], typer.Argument(help="Evaluation ids (eval_…).")],
    as_json: JsonOpt = False,
) -> None:
    """Evaluations side by side: reward mean, each verifier's mean and pass@k (with its 95%
    interval), one column each."""
    with client() as grpo:
        found = [grpo.evaluations.get(e) for e in evaluation_ids]
    emit(found, as_json, lambda _: out.print(comparison(found)))


def comparison(evaluations: list[EvaluationOut]) -> Table:
    """One row per figure, one column per evaluation (its model heading it)."""
    grid = Table(box=None, header_style="bold")
    grid.add_column("")
    for e in evaluations:
        grid.add_column(f"{e.id}\n{e.model}", justify="right", no_wrap=True)
    results = [e.results for e in evaluations]
    grid.add_row("status", *(e.status for e in evaluations))
    grid.add_row("reward_mean", *(_num(r.reward_mean) if r else "" for r in results))
    verifiers = sorted({v for r in results if r for v in r.per_verifier})
    for name in verifiers:
        grid.add_row(
            f"{name} (mean)", *(_num(r.per_verifier.get(name)) if r else "" for r in results)
        )
    ks = sorted({int(k) for r in results if r for k in r.pass_at_k})
    for k in ks:
        cells = []
        for r in results:
            p = r.pass_at_k.get(str(k)) if r else None
            cells.append(f"{p.estimate:.3f} [{p.low:.2f}, {p.high:.2f}]" if p else "")
        grid.add_row(f"pass@{k}", *cells)
    grid.add_row("samples", *(str(r.samples) if r else "" for r in results))
    return grid


def _show(evaluation: EvaluationOut) -> None:
    if evaluation.error is not None:
        err.print(f"{evaluation.id} {evaluation.status}: {evaluation.error.message}")
    out.print(comparison([evaluation]))


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"
