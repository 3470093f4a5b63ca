"""Verifier (reward function) runtime.

Public API used by the API process (validation, `/test`, `/readyz`) and by the training worker:
`KINDS`, `VerifierConfigError`, `validate_config`, `pin_composite`, `open_verifier`, `Verifier`,
`VerifierBudgetExceeded`, `SandboxUnavailableError`, `sandbox_mode`, `sandbox_memory`,
`python_leaves`, `BuiltinHost` (the helper process built-in kinds score in), `JudgeContext`,
`JudgeEndpoint`, `JudgeUnavailableError` (model judges: where they call, cache, counters).
Imports neither torch, FastAPI nor Celery.
"""

from __future__ import annotations

from .base import Sample, ScoreResult, Verifier
from .budget import VerifierBudgetExceeded
from .builtin_host import BuiltinHost
from .composite import Resolver, pin_composite, python_leaves
from .config import KINDS, VerifierConfigError, validate_config
from .factory import open_verifier
from .judge import JudgeContext, JudgeEndpoint, JudgeUnavailableError
from .python_kind import ChildLimits
from .sandbox import SandboxUnavailableError, sandbox_memory, sandbox_mode

__all__ = [
    "KINDS",
    "BuiltinHost",
    "ChildLimits",
    "JudgeContext",
    "JudgeEndpoint",
    "JudgeUnavailableError",
    "Resolver",
    "Sample",
    "SandboxUnavailableError",
    "ScoreResult",
    "Verifier",
    "VerifierBudgetExceeded",
    "VerifierConfigError",
    "open_verifier",
    "pin_composite",
    "python_leaves",
    "sandbox_memory",
    "sandbox_mode",
    "validate_config",
]
