"""Caps on the python sandboxes one submission opens, checked before anything runs.

Each python verifier a job uses, and each python part of a composite it uses, is one
long-lived sandbox for the whole job, holding up to its memory limit; evaluation opens its own
set beside the training one. A job's multi-turn environment is one more (training and
evaluation play their episodes in the same one). Uncapped, one job could hold hundreds (16
composites of 32 python parts: 512 sandboxes, and as many again for evaluation), so the count
is refused at submission with a 422 instead. The host-wide cap, across all jobs and `/test`
calls, is enforced where sandboxes start (`workers/verifiers/slots.py`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from service.core.problems import FieldError, invalid
from service.settings import Settings
from service.verifiers.service import make_resolver
from workers.verifiers import Resolver, python_leaves

Resolved = tuple[int, str, dict[str, Any]]  # a verifier version's (version, kind, config)

WHAT_COUNTS = "each python verifier, and each python part of a composite, is one"
ENVIRONMENT_COUNTS = "the environment's is one, and " + WHAT_COUNTS


def check_sandbox_caps(
    session: Session,
    tenant_id: str,
    pinned_verifiers: list[dict[str, Any]],
    pinned_eval_verifiers: list[dict[str, Any]],
    settings: Settings,
    environment: bool = False,
    known: dict[tuple[str, int | None], Resolved] | None = None,
) -> list[FieldError]:
    """A job's python sandboxes, training and evaluation together, against
    GRPO_MAX_PYTHON_SANDBOXES_PER_JOB. `pinned_eval_verifiers` are the ones evaluation opens:
    empty without an eval_dataset, a copy of the verifiers when eval_verifiers is unset.
    `environment`: the job names a multi-turn environment, one sandbox more. `known`: versions
    the caller has read already, (name, version) -> (version, kind, config)."""
    cap = settings.max_python_sandboxes_per_job
    resolve = memoized(make_resolver(session, tenant_id), known)
    train = _count(pinned_verifiers, resolve) + int(environment)
    evaluation = _count(pinned_eval_verifiers, resolve)
    if train > cap:
        what = ENVIRONMENT_COUNTS if environment else WHAT_COUNTS
        message = f"{train} python sandboxes ({what}); at most {cap} per job"
        return [FieldError(path="$.verifiers", message=message)]
    if train + evaluation > cap:
        message = (
            f"evaluation opens {evaluation} python sandboxes of its own besides the {train} of "
            f"{'verifiers and the environment' if environment else 'verifiers'} "
            f"(eval_verifiers default to verifiers when there is an eval_dataset; "
            f"{WHAT_COUNTS}): {train + evaluation} in all, at most {cap} per job"
        )
        return [FieldError(path="$.eval_verifiers", message=message)]
    return []


def check_test_cap(
    kind: str, config: dict[str, Any], resolve: Resolver, settings: Settings
) -> None:
    """A `/test` call opens the verifier's sandboxes too: the same cap, a 422 beyond it."""
    cap = settings.max_python_sandboxes_per_job
    n = python_leaves(kind, config, resolve)
    if n > cap:
        message = f"this verifier opens {n} python sandboxes ({WHAT_COUNTS}); at most {cap}"
        raise invalid([FieldError(path="path.name", message=message)])


def _count(pinned: list[dict[str, Any]], resolve: Resolver) -> int:
    n = 0
    for ref in pinned:
        try:
            _, kind, config = resolve(ref["name"], ref["version"])
        except LookupError:
            continue  # reported by the pinning itself
        n += python_leaves(kind, config, resolve)
    return n


def memoized(
    resolve: Resolver, known: dict[tuple[str, int | None], Resolved] | None = None
) -> Resolver:
    """Each (name, version) read once: eval_verifiers usually repeat the verifiers."""
    seen = dict(known or {})

    def answer(name: str, version: int | None) -> tuple[int, str, dict[str, Any]]:
        if (name, version) not in seen:
            seen[(name, version)] = resolve(name, version)
        return seen[(name, version)]

    return answer
