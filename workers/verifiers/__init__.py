"""Verifier (reward function) runtime.

Public API used by the API process (validation, `/test`) and by the training worker:
`KINDS`, `VerifierConfigError`, `validate_config`, `open_verifier`, `Verifier`.
Imports neither torch, FastAPI nor Celery.
"""

from __future__ import annotations

from .base import Sample, ScoreResult, Verifier
from .builtin import BUILDERS, FunctionVerifier
from .config import KINDS, PythonConfig, VerifierConfigError, parse_config, validate_config
from .python_kind import ChildLimits, PythonVerifier

__all__ = [
    "KINDS",
    "ChildLimits",
    "Sample",
    "ScoreResult",
    "Verifier",
    "VerifierConfigError",
    "open_verifier",
    "validate_config",
]


def open_verifier(
    kind: str, config: dict, *, name: str = "verifier", limits: ChildLimits | None = None
) -> Verifier:
    """Build a runnable verifier from a (validated or raw) config.

    Use it as a context manager; close() stops the child process of a `python` verifier, which
    is started lazily by the first score(). Raises VerifierConfigError for a bad config.
    `limits` (python only) overrides the child's rlimits.
    """
    model = parse_config(kind, config)
    if isinstance(model, PythonConfig):
        return PythonVerifier(name, model, limits=limits)
    return FunctionVerifier(name, BUILDERS[kind](model))
