"""`grpo`: the grpo-service API from a terminal. Every command takes `--json` for scripts.

Exit status: 0 success, 1 an API error or a job that did not succeed, 2 bad input (usage,
unreadable or malformed files), 3 the server is unreachable.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from grpo_client import (
    cli_environments,  # noqa: F401  (registers `grpo environments`)
    cli_evals,  # noqa: F401  (registers `grpo evals`)
    cli_jobs,  # noqa: F401  (registers the jobs and checkpoints commands)
    cli_models,  # noqa: F401  (registers `grpo models`)
    cli_rollouts,  # noqa: F401  (registers `grpo jobs rollouts`)
    cli_usage,  # noqa: F401  (registers `grpo usage`, `grpo jobs estimate`)
    cli_webhooks,  # noqa: F401  (registers `grpo webhooks`)
    config,
)
from grpo_client.cli_base import (
    BadInput,
    ExistingFile,
    JsonOpt,
    app,
    client,
    datasets_app,
    emit,
    err,
    load_spec,
    options,
    out,
    read_records,
    table,
    verifiers_app,
)
from grpo_client.client import Client
from grpo_client.errors import ApiError, ClientError, ConnectionFailed

# ---- login ---------------------------------------------------------------------------------


@app.command()
def logout(as_json: JsonOpt = False) -> None:
    """Forget the stored URL and key (the file `grpo login` wrote)."""
    path = config.config_path()
    removed = path.exists()
    path.unlink(missing_ok=True)
    emit(
        {"config": str(path), "removed": removed},
        as_json,
        lambda v: err.print(f"logged out (removed {v['config']})" if removed else "not logged in"),
    )


@app.command()
def whoami(as_json: JsonOpt = False) -> None:
    """Which server, which tenant, which key (and where the key came from)."""
    profile = config.resolve(options["url"], options["api_key"])
    with client() as grpo:
        me = grpo.me()
    value = {"url": profile.url, "key_source": profile.source, **me}
    source = {"option": "--api-key", "env": "GRPO_API_KEY", "file": str(config.config_path())}

    def render(v: dict[str, Any]) -> None:
        out.print(f"tenant {v['tenant']} ({v['tenant_id']}) at {v['url']}")
        out.print(f"key {v['key']['prefix']}… from {source.get(v['key_source'], v['key_source'])}")

    emit(value, as_json, render)


@app.command()
def login(
    url: Annotated[str, typer.Option(prompt="API URL", help="API base URL.")] = config.DEFAULT_URL,
    api_key: Annotated[
        str, typer.Option(prompt="API key", hide_input=True, help="The key to store.")
    ] = "",
    as_json: JsonOpt = False,
) -> None:
    """Check the key against the server, then store URL and key (file mode 0600) in
    $XDG_CONFIG_HOME/grpo/config.json, else ~/.config/grpo/config.json on Linux,
    ~/Library/Application Support/grpo/config.json on macOS, %APPDATA%\\grpo\\config.json on
    Windows."""
    with Client(url, api_key, max_retries=1) as grpo:
        grpo.jobs.list(limit=1)  # 401 for a bad key, ConnectionFailed for a bad URL
    path = config.save_file(url.rstrip("/"), api_key)
    emit(
        {"url": url.rstrip("/"), "config": str(path)},
        as_json,
        lambda v: err.print(f"logged in to {v['url']} (saved in {v['config']})"),
    )


# ---- verifiers -----------------------------------------------------------------------------


@verifiers_app.command("create")
def verifiers_create(
    file: ExistingFile,
    name: Annotated[str, typer.Option(help="Verifier name (an existing one gets a version).")],
    kind: Annotated[
        str, typer.Option(help="python: FILE is the source; other kinds: FILE is a JSON config.")
    ] = "python",
    description: Annotated[str, typer.Option(help="Free text.")] = "",
    timeout_s: Annotated[float | None, typer.Option(help="python: per-batch timeout.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Register a verifier from a Python file defining `verify(prompt, completion, **fields)`."""
    text = file.read_text(encoding="utf-8")
    if kind == "python":
        cfg: dict[str, Any] = {"source": text}
        if timeout_s is not None:
            cfg["timeout_s"] = timeout_s
    else:
        cfg = load_spec(file)
    with client() as grpo:
        ver = grpo.verifiers.create(name, kind, cfg, description)
    emit(ver, as_json, lambda v: out.print(f"{v.name} version {v.version} ({v.id}, {v.kind})"))


@verifiers_app.command("test")
def verifiers_test(
    name: Annotated[str, typer.Argument(help="Verifier name.")],
    samples: ExistingFile,
    version: Annotated[int | None, typer.Option(help="Default: the latest.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Score a JSONL file of `{prompt, completion, ...fields}` samples; exits 1 when the
    verifier failed on any of them (its error is in the table)."""
    records = read_records(samples)
    with client() as grpo:
        result = grpo.verifiers.test(name, records, version)

    def render(r: Any) -> None:
        rows = [
            [i + 1, rec.get("completion", "")[:50], score, error]
            for i, (rec, score, error) in enumerate(zip(records, r.scores, r.errors, strict=True))
        ]
        out.print(table(["#", "completion", "score", "error"], rows))
        out.print(f"{len(rows)} samples in {r.elapsed_ms:.0f} ms")

    emit(result, as_json, render)
    failed = sum(error is not None for error in result.errors)
    if failed:
        err.print(f"the verifier failed on {failed} of {len(records)} samples")
        raise typer.Exit(1)


@verifiers_app.command("list")
def verifiers_list(
    name: Annotated[str | None, typer.Option(help="Only this name's versions.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20,
    as_json: JsonOpt = False,
) -> None:
    """List verifiers, newest first."""
    with client() as grpo:
        page = grpo.verifiers.list(name=name, limit=limit)
    rows = [[v.name, v.version, v.kind, v.id, f"{v.created_at:%Y-%m-%d %H:%M}"] for v in page.data]
    emit(
        page,
        as_json,
        lambda _: out.print(table(["name", "version", "kind", "id", "created"], rows)),
    )


# ---- datasets ------------------------------------------------------------------------------


@datasets_app.command("upload")
def datasets_upload(
    file: ExistingFile,
    name: Annotated[str | None, typer.Option(help="Default: the file name's stem.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Upload a JSONL file of `{prompt, ...fields}` records."""
    with client() as grpo:
        ds = grpo.datasets.upload(file, name)
    emit(ds, as_json, lambda d: out.print(f"{d.id}  {d.name}: {d.num_records} records"))


@datasets_app.command("list")
def datasets_list(
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20, as_json: JsonOpt = False
) -> None:
    """List datasets, newest first."""
    with client() as grpo:
        page = grpo.datasets.list(limit=limit)
    rows = [[d.id, d.name, d.num_records, f"{d.created_at:%Y-%m-%d %H:%M}"] for d in page.data]
    emit(page, as_json, lambda _: out.print(table(["id", "name", "records", "created"], rows)))


@datasets_app.command("from-rollouts")
def datasets_from_rollouts(
    job_id: str,
    format: Annotated[str, typer.Option("--format", help="sft or dpo.")],
    split: Annotated[str | None, typer.Option(help="train (default) or eval.")] = None,
    step: Annotated[list[int] | None, typer.Option(help="Only this step; repeatable.")] = None,
    min_reward: Annotated[float | None, typer.Option(help="Least reward kept.")] = None,
    name: Annotated[str | None, typer.Option(help="Default: JOB-FORMAT.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Make a dataset of a job's stored rollouts (sft: each completion; dpo: best vs worst)."""
    with client() as grpo:
        ds = grpo.datasets.from_rollouts(
            job_id, format, split=split, steps=step, min_reward=min_reward, name=name
        )
    emit(ds, as_json, lambda d: out.print(f"{d.id}  {d.name}: {d.num_records} records"))


@datasets_app.command("records")
def datasets_records(
    dataset_id: str,
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20,
    after: Annotated[str | None, typer.Option(help="The id of the last record shown.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show one page of a dataset's records, in file order (one JSON object a line)."""
    with client() as grpo:
        page = grpo.datasets.records(dataset_id, limit=limit, after=after)

    def render(_: Any) -> None:
        for r in page.data:
            print(f"{r.id}\t{json.dumps(r.record, ensure_ascii=False)}")
        if page.has_more:
            print(f"# more: --after {page.next}", file=sys.stderr)

    emit(page, as_json, render)


@datasets_app.command("download")
def datasets_download(
    dataset: Annotated[str, typer.Argument(help="A dataset id (ds_…), or the name of yours.")],
    out_path: Annotated[
        Path | None,
        typer.Option("--out", help="The JSONL file to write, or a folder for <id>.jsonl."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Download a dataset's records as stored: JSONL, one object a line (default: <id>.jsonl
    in the current folder)."""
    with client() as grpo:
        ds = grpo.datasets.find(dataset)
        target = out_path or Path(f"{ds.id}.jsonl")
        if target.is_dir():
            target = target / f"{ds.id}.jsonl"
        target.parent.mkdir(parents=True, exist_ok=True)
        path = grpo.datasets.download(ds.id, target)
    result = {"id": ds.id, "name": ds.name, "records": ds.num_records, "path": str(path)}
    shown = f"{path}  {ds.num_records} records of {ds.name}"
    emit(result, as_json, lambda _: out.print(shown, soft_wrap=True))  # a path: never folded


def main() -> None:
    try:
        app()
    except ConnectionFailed as exc:
        _fail(3, f"{exc}\nIs the server running? Set --url or GRPO_URL, or run `grpo login`.")
    except ApiError as exc:
        hint = "\nCheck the API key (`grpo login`, GRPO_API_KEY)." if exc.status == 401 else ""
        _fail(1, exc.message + hint, exc.problem)
    except BadInput as exc:
        _fail(2, str(exc))
    except ClientError as exc:
        _fail(1, str(exc))
    except KeyboardInterrupt:
        _fail(130, "interrupted")


def _fail(code: int, message: str, problem: dict[str, Any] | None = None) -> None:
    if options["json"] or "--json" in sys.argv:
        print(json.dumps({"error": problem or {"detail": message}}))
    err.print(Text.assemble(("error: ", "red"), message))
    raise SystemExit(code)
