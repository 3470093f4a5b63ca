"""OpenAI's `/v1/fine_tuning/alpha/graders/{validate,run}` over our `openai_grader` kind.

Both go through exactly what a job uses: `validate_config("openai_grader", ...)` and
`open_verifier`, so a grader that runs here runs the same in training. `run` scores one sample
on the calling (threadpool) thread, never the event loop, under the kinds' own deadlines (the
built-in helper's per-batch deadline, the python sandbox's `timeout_s`).
"""

from __future__ import annotations

import time
from typing import Any

from service.graders.schemas import (
    GraderRunErrors,
    GraderRunMetadata,
    GraderRunRequest,
    GraderRunResponse,
)
from service.problems import FieldError, ProblemError, invalid
from service.settings import Settings
from workers.verifiers import (
    SandboxUnavailableError,
    VerifierConfigError,
    open_verifier,
    validate_config,
)
from workers.verifiers.grader_config import MODEL_GRADER_TYPES, grader_python_sandboxes
from workers.verifiers.grader_kind import KIND, MultiGraderVerifier


def _model_graders(grader: dict[str, Any]) -> list[str]:
    """Paths of the model-judged graders in `grader` (valid in OpenAI's API, not run here)."""
    if grader.get("type") in MODEL_GRADER_TYPES:
        return ["$.grader"]
    subs = grader.get("graders") if grader.get("type") == "multi" else None
    if not isinstance(subs, dict):
        return []
    return [
        f"$.grader.graders.{key}"
        for key, sub in subs.items()
        if isinstance(sub, dict) and sub.get("type") in MODEL_GRADER_TYPES
    ]


def validate_grader(grader: dict[str, Any]) -> dict[str, Any]:
    """The normalised grader; 400 for a model grader, 422 naming every bad field otherwise."""
    if paths := _model_graders(grader):
        detail = (
            f"{', '.join(paths)}: score_model and label_model graders need a model judge, "
            "which this service does not run yet"
        )
        raise ProblemError(400, "Unsupported Grader", detail)
    try:
        return validate_config(KIND, grader)
    except VerifierConfigError as exc:
        paths = [(".".join(["$.grader", *map(str, p)]), m) for p, m in exc.errors]
        raise invalid([FieldError(path=path, message=m) for path, m in paths]) from exc


def _check_sandbox_cap(grader: dict[str, Any], settings: Settings) -> None:
    """A run opens the grader's python sandboxes: the `/test` calls' cap, a 422 beyond it."""
    cap, n = settings.max_python_sandboxes_per_job, grader_python_sandboxes(grader)
    if n > cap:
        message = f"this grader opens {n} python sandboxes (one per python grader); at most {cap}"
        raise invalid([FieldError(path="$.grader.graders", message=message)])


def _errors(error: str | None, grader: dict[str, Any]) -> GraderRunErrors:
    """OpenAI's error flags for one of our error texts."""
    flags = GraderRunErrors()
    if error is None:
        return flags
    kind = grader.get("type")
    if kind == "multi" and error.startswith("grader "):
        key = error[len("grader ") :].split(":", 1)[0]
        kind = grader.get("graders", {}).get(key, {}).get("type")
    if error.startswith("calculate_output:"):
        flags.formula_parse_error = True
    elif "MissingField:" in error:
        flags.invalid_variable_error = True
    elif "timeout" in error:
        flags.unresponsive_reward_error = True
    elif kind == "python" and ("process died" in error or "protocol violation" in error):
        flags.python_grader_server_error = True
        flags.python_grader_server_error_type = "sandbox"
    elif kind == "python":
        flags.python_grader_runtime_error = True
        flags.python_grader_runtime_error_details = error
    else:
        flags.other_error = True
    return flags


def run_grader(body: GraderRunRequest, settings: Settings) -> GraderRunResponse:
    grader = validate_grader(body.grader)
    _check_sandbox_cap(grader, settings)
    sample = {**body.item, "completion": body.model_sample}
    started = time.perf_counter()
    sub_rewards: dict[str, float] = {}
    try:
        # Opened and scored on this one thread: the sandbox dies with the thread that made it.
        with open_verifier(KIND, grader, name=grader["name"]) as verifier:
            if isinstance(verifier, MultiGraderVerifier):
                (scores, errors), parts = verifier.score_parts([sample])
                sub_rewards = parts[0]
            else:
                scores, errors = verifier.score([sample])
    except SandboxUnavailableError as exc:
        raise ProblemError(503, "Sandbox Unavailable", str(exc)) from exc
    metadata = GraderRunMetadata(
        name=grader["name"],
        type=grader["type"],
        errors=_errors(errors[0], grader),
        execution_time=round(time.perf_counter() - started, 6),
        scores=dict(sub_rewards),
    )
    reward = scores[0] if scores[0] is not None else 0.0
    return GraderRunResponse(reward=reward, metadata=metadata, sub_rewards=sub_rewards)
