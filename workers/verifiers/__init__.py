"""Verifier (reward function) runtime.

Public API used by the API process (validation, `/test`, `/readyz`) and by the training worker:
`KINDS`, `VerifierConfigError`, `validate_config`, `pin_composite`, `open_verifier`, `Verifier`,
`VerifierBudgetExceeded`, `SandboxUnavailableError`, `sandbox_mode`.
Imports neither torch, FastAPI nor Celery.
"""

from __future__ import annotations

from .base import Sample, ScoreResult, Verifier
from .budget import VerifierBudgetExceeded
from .composite import Resolver, pin_composite
from .config import KINDS, VerifierConfigError, validate_config
from .factory import open_verifier
from .python_kind import ChildLimits
from .sandbox import SandboxUnavailableError, sandbox_mode

__all__ = [
    "KINDS",
    "ChildLimits",
    "Resolver",
    "Sample",
    "SandboxUnavailableError",
    "ScoreResult",
    "Verifier",
    "VerifierBudgetExceeded",
    "VerifierConfigError",
    "open_verifier",
    "pin_composite",
    "sandbox_mode",
    "validate_config",
]
