"""OpenAI's `/v1/fine_tuning/alpha/graders/{validate,run}` over our `openai_grader` kind.

Both go through exactly what a job uses: `validate_config("openai_grader", ...)` and
`open_verifier`, so a grader that runs here runs the same in training. `run` scores one sample
on the calling (threadpool) thread, never the event loop, under the kinds' own deadlines (the
built-in helper's per-batch deadline, the python sandbox's `timeout_s`, a model judge's
GRPO_JUDGE_DEADLINE_S), with the database connection released first.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy.orm import Session

from service.core.problems import FieldError, ProblemError, invalid
from service.graders.schemas import (
    GraderRunErrors,
    GraderRunMetadata,
    GraderRunRequest,
    GraderRunResponse,
)
from service.judges.checks import judge_errors
from service.judges.endpoints import judge_context
from service.settings import Settings
from workers.verifiers import (
    SandboxUnavailableError,
    VerifierConfigError,
    open_verifier,
    validate_config,
)
from workers.verifiers.grader_config import MODEL_GRADER_TYPES, grader_python_sandboxes
from workers.verifiers.grader_kind import KIND, MultiGraderVerifier


def validate_grader(
    session: Session, settings: Settings, tenant_id: str, grader: dict[str, Any]
) -> dict[str, Any]:
    """The normalised grader; 422 naming every bad field (a judge's model or secret this
    tenant cannot use included)."""
    try:
        config = validate_config(KIND, grader)
    except VerifierConfigError as exc:
        paths = [(".".join(["$.grader", *map(str, p)]), m) for p, m in exc.errors]
        raise invalid([FieldError(path=path, message=m) for path, m in paths]) from exc
    if errors := judge_errors(session, settings, tenant_id, KIND, config, "$.grader"):
        raise invalid(errors)
    return config


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
    if kind in MODEL_GRADER_TYPES:
        _judge_flags(flags, error)
    elif error.startswith("calculate_output:"):
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


def _judge_flags(flags: GraderRunErrors, error: str) -> None:
    """A model grader's error: a garbage answer, or the judge not answering."""
    if error.startswith("the judge's"):
        flags.model_grader_parse_error = True
    elif "MissingField:" in error:
        flags.invalid_variable_error = True
    else:
        flags.model_grader_server_error = True
        flags.model_grader_server_error_details = error


def _sampled_model(grader: dict[str, Any]) -> str | None:
    if grader["type"] in MODEL_GRADER_TYPES:
        return str(grader["model"])
    return None


def run_grader(
    session: Session, tenant_id: str, body: GraderRunRequest, settings: Settings
) -> GraderRunResponse:
    grader = validate_grader(session, settings, tenant_id, body.grader)
    session.close()  # back to the pool before the grader runs (a judge may take seconds)
    _check_sandbox_cap(grader, settings)
    sample = {**body.item, "completion": body.model_sample}
    started = time.perf_counter()
    sub_rewards: dict[str, float] = {}
    try:
        # Opened and scored on this one thread: the sandbox dies with the thread that made it.
        judges = judge_context(settings, tenant_id)
        with open_verifier(KIND, grader, name=grader["name"], judges=judges) as verifier:
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
        sampled_model_name=_sampled_model(grader),
    )
    reward = scores[0] if scores[0] is not None else 0.0
    return GraderRunResponse(reward=reward, metadata=metadata, sub_rewards=sub_rewards)
