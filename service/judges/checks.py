"""Checked when a judge is created (a `judge` verifier, a score_model/label_model grader,
alone or inside a multi grader): the model it names is one this tenant may use.

On the inference backend a judge's `model` is a catalog model or one of the tenant's own
checkpoints (another tenant's reads exactly as a missing one); on the `openai` backend only a
catalog model (adapters are loaded by the chat proxy, not by judges). On GRPO_JUDGE_BASE_URL
the names are that server's own, passed through, and no checkpoint id is. With
`endpoint_secret` the model is the external endpoint's to know, and the secret must exist.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy.orm import Session

from service.catalog.service import find_model, find_tenant_checkpoint
from service.core.problems import FieldError
from service.secrets.service import find_secret
from service.settings import Settings
from workers.verifiers.grader_config import MODEL_GRADER_TYPES


def judge_leaves(kind: str, config: dict[str, Any], path: str) -> Iterator[tuple[str, dict]]:
    """(JSON path, config) of every model judge a (validated) verifier config holds; a
    composite's parts are verifiers checked when they were registered."""
    if kind == "judge":
        yield path, config
    elif kind == "openai_grader":
        if config.get("type") in MODEL_GRADER_TYPES:
            yield path, config
        elif config.get("type") == "multi":
            for key, sub in config.get("graders", {}).items():
                if sub.get("type") in MODEL_GRADER_TYPES:
                    yield f"{path}.graders.{key}", sub


def judge_errors(
    session: Session, settings: Settings, tenant_id: str, kind: str, config: dict[str, Any],
    path: str,
) -> list[FieldError]:  # fmt: skip
    """A FieldError for every judge whose model or secret this tenant cannot use."""
    errors = []
    for where, judge in judge_leaves(kind, config, path):
        secret, model = judge.get("endpoint_secret"), judge["model"]
        if secret is not None:
            if find_secret(session, tenant_id, secret) is None:
                message = f"you have no secret '{secret}'"
                errors.append(FieldError(path=f"{where}.endpoint_secret", message=message))
            continue
        if refusal := _model_error(session, settings, tenant_id, model):
            errors.append(FieldError(path=f"{where}.model", message=refusal))
    return errors


def _model_error(session: Session, settings: Settings, tenant_id: str, model: str) -> str | None:
    checkpoint = model.startswith("ckpt_")
    if settings.judge_base_url:
        return f"model '{model}': the judge endpoint serves no checkpoints" if checkpoint else None
    if not checkpoint and find_model(session, model) is not None:
        return None
    if checkpoint and find_tenant_checkpoint(session, tenant_id, model) is not None:
        if settings.inference_backend == "grpo":
            return None
        return f"model '{model}': the inference backend judges with catalog models only"
    return f"model '{model}' not found (a catalog model or one of your checkpoints)"
