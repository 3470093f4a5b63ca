"""What a run stores and how its failures are named: verified uploads, stable error codes."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from service.storage import ObjectStorage

log = logging.getLogger(__name__)

ERROR_CODES = {
    "ModelLoadError": "model_load_error",
    "VerifierBudgetExceeded": "verifier_budget_exceeded",
    "EnvironmentBudgetExceeded": "environment_budget_exceeded",
    "SandboxUnavailableError": "sandbox_unavailable",
    "LookupError": "missing_reference",
    "NonFiniteTraining": "non_finite_training",
    "PreflightFailed": "preflight_failed",
    "BudgetExhausted": "budget_exhausted",
    "VerifiersFailing": "verifier_errors",
}


def error_code(exc: BaseException) -> str:
    """A stable, documented code for the job's `error` (the message carries the detail)."""
    return ERROR_CODES.get(type(exc).__name__, "internal_error")


def upload_verified(
    storage: ObjectStorage, key: str, path: Path, size: int, attempts: int = 4
) -> None:
    """Upload with retries, then check the stored size: a job never points at a partial
    checkpoint. (boto3 also sends a checksum that S3 verifies on receipt.)"""
    for attempt in range(1, attempts + 1):
        try:
            storage.put_file(key, path)
            stored = storage.size(key)
            if stored != size:
                raise OSError(f"stored {stored} bytes of {size} for {key}")
            return
        except Exception:
            if attempt == attempts:
                raise
            log.warning("checkpoint upload %s failed (attempt %d); retrying", key, attempt)
            time.sleep(min(30.0, 0.5 * 2**attempt))
