"""`grpo.jobs.preflight(spec)`: POST /v1/jobs/preflight, then poll its `Location` until final."""

from __future__ import annotations

import time
from typing import Any

from grpo_client.errors import ClientError
from grpo_client.models_generated import PreflightOut
from grpo_client.transport import Transport

FINAL = ("succeeded", "failed")
# The API holds the POST open up to GRPO_PREFLIGHT_WAIT_S (30 s by default): read past it.
POST_READ_TIMEOUT_S = 660.0


class PreflightTimeout(ClientError):
    """`jobs.preflight` gave up before the pre-flight finished."""


def run_preflight(
    transport: Transport,
    body: dict[str, Any],
    *,
    timeout: float | None = None,
    poll_interval: float = 2.0,
    idempotency_key: str | None = None,
) -> PreflightOut:
    deadline = None if timeout is None else time.monotonic() + timeout
    data = transport.json(
        "POST", "/v1/jobs/preflight", json=body, creates=True,
        idempotency_key=idempotency_key, timeout=POST_READ_TIMEOUT_S,
    )  # fmt: skip
    result = PreflightOut.model_validate(data)
    while result.status not in FINAL:
        if deadline is not None and time.monotonic() >= deadline:
            raise PreflightTimeout(f"pre-flight {result.id} is still {result.status}")
        time.sleep(poll_interval)
        data = transport.json("GET", f"/v1/jobs/preflight/{result.id}")
        result = PreflightOut.model_validate(data)
    return result


__all__ = ["PreflightOut", "PreflightTimeout", "run_preflight"]
