"""`grpo-service train SPEC.json --out DIR`: the GRPO engine run locally, without API or queue.

SPEC has the schema of `POST /v1/jobs`, with two differences:
- `dataset` (and `eval_dataset`) is a JSONL file path, one record per line (`{"prompt": ...,
  **fields}`); a relative path is read from the working directory, or else next to SPEC.
  Dataset ids (`ds_...`) live in the service and are refused here.
- a verifier is inline: `{"kind": "python", "config": {"source": "..."}, "weight": 1.0,
  "name": "..."}` (`name` defaults to `<kind>-<index>`), opened with
  `workers.verifiers.open_verifier`, so a `python` verifier runs in the same sandbox as in the
  worker (its errors, e.g. no sandbox available, surface unchanged). Registry verifiers
  (`{"name": ..., "version": ...}` without `kind`) live in the service and are refused here.
- an environment is a local Python file: `"environment": {"source": "env.py", "max_turns": 4,
  "timeout_s"?: 10}` (a relative path as the dataset's), run in the same sandbox as in the
  worker; its name is the file's stem. With an environment, `verifiers` may be left out.

It calls the same `workers.grpo.trainer.train` as the worker, prints one JSON line per step to
stdout (`{"step": k, **metrics}`), events as JSON lines on stderr, and writes checkpoints to
`DIR/checkpoints/step-NNNNNN` (with `keep_checkpoints`, only the newest N and the final one stay).
Only periodic checkpoints can be resumed (`--resume-from`): the final one has no trainer state.
With `--nproc N` (N > 1) the same run goes on N processes (`workers.grpo.launch`: PyTorch's
elastic launcher, FSDP2; docs/distributed.md); process 0 prints the lines and writes the
checkpoints, the figures being those of the whole batch. Started by `torchrun` (one process of
a larger launch, e.g. across nodes), it is one rank of that launch's group.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from workers.grpo.config import TrainSpec

SERVICE_ONLY_KEYS = {"queue"}  # accepted for compatibility with job specs, ignored here


class LocalSpecError(ValueError):
    """The SPEC file cannot run locally; the message says why and what to write instead."""


def local_errors() -> tuple[type[Exception], ...]:
    """Errors shown as one line by the CLI: bad spec, bad verifier config, no sandbox, no model,
    a `--resume-from` without trainer state (a final checkpoint)."""
    from workers.grpo.checkpoint import NotResumable
    from workers.grpo.launch import WorldSizeError
    from workers.grpo.policy import ModelLoadError
    from workers.verifiers import VerifierConfigError
    from workers.verifiers.sandbox import SandboxUnavailableError

    return (
        LocalSpecError,
        VerifierConfigError,
        SandboxUnavailableError,
        ModelLoadError,
        NotResumable,
        WorldSizeError,
    )


@dataclass
class LocalJob:
    spec: TrainSpec
    records: list[dict]
    verifiers: list[dict[str, Any]]
    eval_records: list[dict] | None
    eval_verifiers: list[dict[str, Any]] | None
    environment: Any = None  # workers.environments.EnvironmentConfig of a local source file


@dataclass
class InlineScorer:
    """An opened verifier as the engine's Scorer (name, weight, score)."""

    name: str
    weight: float
    verifier: Any

    def score(self, samples: list[dict]) -> tuple[list[float | None], list[str | None]]:
        return self.verifier.score(samples)


def _read_jsonl(value: Any, base: Path, key: str) -> list[dict]:
    if not isinstance(value, str) or value.startswith("ds_"):
        raise LocalSpecError(
            f"{key}: {value!r} is not a JSONL path; dataset ids need the service, "
            "locally give the path of a JSONL file"
        )
    path = Path(value)
    if not path.is_absolute() and not path.exists():
        path = base / path
    if not path.is_file():
        raise LocalSpecError(f"{key}: no such file {value!r}")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not records or not all(isinstance(r, dict) and "prompt" in r for r in records):
        raise LocalSpecError(f"{key}: {path} must hold JSON objects with a 'prompt', one a line")
    return records


def _local_environment(raw: dict[str, Any], base: Path) -> Any:
    """The spec's `environment.source` file read into an EnvironmentConfig; `raw` keeps the
    TrainSpec part (name: the file's stem, max_turns)."""
    env = raw.get("environment")
    if env is None:
        return None
    if not isinstance(env, dict) or not isinstance(env.get("source"), str):
        raise LocalSpecError(
            'environment: locally give the path of its source file: {"source": "env.py", '
            '"max_turns": 4}; registered environments need the service'
        )
    from pydantic import ValidationError

    from workers.environments import EnvironmentConfig

    path = Path(env.pop("source"))
    path = path if path.is_absolute() or path.exists() else base / path
    if not path.is_file():
        raise LocalSpecError(f"environment.source: no such file {str(path)!r}")
    config = {"source": path.read_text()} | {k: env.pop(k) for k in ("timeout_s",) if k in env}
    env.setdefault("name", path.stem)
    try:
        return EnvironmentConfig.model_validate(config)
    except ValidationError as exc:
        raise LocalSpecError(f"environment.source: {exc.errors()[0]['msg']}") from None


def _check_verifiers(value: Any, key: str, required: bool = True) -> list[dict[str, Any]]:
    if not required and value in (None, []):
        return []
    if not isinstance(value, list) or not value:
        raise LocalSpecError(f"{key}: a non-empty list of inline verifiers is required")
    out = []
    for i, v in enumerate(value):
        if not isinstance(v, dict) or "kind" not in v:
            name = v.get("name") if isinstance(v, dict) else v
            raise LocalSpecError(
                f"{key}[{i}]: registry verifier {name!r} is not available locally; inline it "
                'as {"kind": ..., "config": {...}, "weight": 1.0}'
            )
        extra = set(v) - {"kind", "config", "weight", "name"}
        if extra:
            raise LocalSpecError(f"{key}[{i}]: unknown fields {sorted(extra)}")
        if v["kind"] == "composite":
            raise LocalSpecError(f"{key}[{i}]: composite verifiers need the registry")
        name = str(v.get("name") or f"{v['kind']}-{i}")
        out.append({"kind": v["kind"], "config": v.get("config", {}), "name": name,
                    "weight": float(v.get("weight", 1.0))})  # fmt: skip
    return out


def load_local_job(spec_path: Path) -> LocalJob:
    """Parse SPEC: the training knobs (validated as TrainSpec), data and inline verifiers."""
    raw = json.loads(Path(spec_path).read_text())
    if not isinstance(raw, dict):
        raise LocalSpecError("SPEC must be a JSON object")
    base = Path(spec_path).resolve().parent
    records = _read_jsonl(raw.pop("dataset", None), base, "dataset")
    environment = _local_environment(raw, base)
    verifiers = _check_verifiers(raw.pop("verifiers", None), "verifiers", environment is None)
    eval_path, eval_verifiers = raw.pop("eval_dataset", None), raw.pop("eval_verifiers", None)
    for key in SERVICE_ONLY_KEYS:
        raw.pop(key, None)
    return LocalJob(
        spec=TrainSpec.model_validate(raw),
        records=records,
        verifiers=verifiers,
        eval_records=None if eval_path is None else _read_jsonl(eval_path, base, "eval_dataset"),
        eval_verifiers=None
        if eval_verifiers is None
        else _check_verifiers(eval_verifiers, "eval_verifiers"),
        environment=environment,
    )


@contextmanager
def open_scorers(verifiers: list[dict[str, Any]]) -> Iterator[list[InlineScorer]]:
    from workers.verifiers import open_verifier

    with ExitStack() as stack:
        yield [
            InlineScorer(
                v["name"],
                v["weight"],
                stack.enter_context(open_verifier(v["kind"], v["config"], name=v["name"])),
            )
            for v in verifiers
        ]


def run_local(
    spec_path: Path,
    out_dir: Path,
    *,
    resume_from: Path | None = None,
    device: str | None = None,
    stdout: TextIO = sys.stdout,
    stderr: TextIO = sys.stderr,
    nproc: int = 1,
) -> int:
    """Train; one JSON line of metrics per step on `stdout`. Returns the steps completed.
    With `nproc` > 1 the processes print on their own standard streams (process 0 alone)."""
    job = load_local_job(spec_path)
    if nproc > 1:
        from workers.grpo.launch import check_world, launch

        check_world(job.spec, nproc)  # before any process starts
        return launch(nproc, _rank, spec_path, out_dir, resume_from, device)[0]
    if os.environ.get("TORCHELASTIC_RUN_ID") and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # One rank of a launch made outside (torchrun across nodes: k8s/overlays/multinode):
        # join its group as the ranks `launch` starts do.
        from workers.grpo.launch import check_world

        check_world(job.spec, int(os.environ["WORLD_SIZE"]), knob="WORLD_SIZE")
        return _rank(spec_path, out_dir, resume_from, device)
    return _train(job, out_dir, resume_from, device, stdout, stderr)


def _rank(spec_path: Path, out_dir: Path, resume_from: Path | None, device: str | None) -> int:
    """One of the launcher's processes: join the group, train; process 0 speaks."""
    import torch.distributed as dist

    from workers.grpo.launch import join, leave

    device = join(device)
    try:
        job = load_local_job(spec_path)
        if dist.get_rank() == 0:
            return _train(job, out_dir, resume_from, device, sys.stdout, sys.stderr)
        return _train(job, out_dir, resume_from, device, None, None)
    finally:
        leave()


def _train(
    job: LocalJob,
    out_dir: Path,
    resume_from: Path | None,
    device: str | None,
    stdout: TextIO | None,
    stderr: TextIO | None,
) -> int:
    """The run in this process; metrics and events on `stdout` / `stderr` (None: silent)."""
    from workers.grpo.trainer import TrainHooks, train

    def on_step(step: int, metrics: dict[str, float]) -> None:
        print(json.dumps({"step": step, **metrics}), file=stdout, flush=True)

    def on_event(kind: str, message: str, data: dict) -> None:
        event = {"event": kind, "message": message, "data": data}
        print(json.dumps(event, default=str), file=stderr, flush=True)

    hooks = TrainHooks(on_step=on_step, on_event=on_event) if stdout is not None else TrainHooks()
    with ExitStack() as stack:
        scorers = stack.enter_context(open_scorers(job.verifiers))
        eval_scorers = None
        if job.eval_verifiers is not None:
            eval_scorers = stack.enter_context(open_scorers(job.eval_verifiers))
        environment = None
        if job.environment is not None:
            from workers.environments import SandboxedEnvironment

            name = job.spec.environment.name if job.spec.environment else "environment"
            environment = stack.enter_context(SandboxedEnvironment(job.environment, name=name))
        result = train(
            job.spec,
            job.records,
            scorers,
            Path(out_dir),
            hooks,
            resume_from=resume_from,
            device=device,
            eval_records=job.eval_records,
            eval_scorers=eval_scorers,
            environment=environment,
        )
    return result.steps_completed
