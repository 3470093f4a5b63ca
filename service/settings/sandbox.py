"""Where verifiers run: the built-in verifiers' deadline and the python sandboxes' caps."""

from __future__ import annotations

from pydantic import BaseModel, Field


class SandboxSettings(BaseModel):
    """Some of these are also read straight from the environment by workers/verifiers/, which
    never imports the service: their names and defaults must stay in step with those readers."""

    builtin_verifier_timeout_s: float = Field(
        10.0,
        gt=0,
        allow_inf_nan=False,
        description="Per-batch deadline of the built-in verifier kinds (read from the "
        "environment by workers/verifiers/builtin_host.py).",
    )
    allow_unsafe_verifiers: bool = Field(
        False, description="Run python verifiers without the bubblewrap sandbox (never in prod)."
    )
    max_python_sandboxes_per_job: int = Field(
        8,
        ge=1,
        description="Python sandboxes one job may open (python verifiers and python composite "
        "parts, of verifiers and eval_verifiers), and one `/test` call: 422 beyond.",
    )
    max_sandboxes_per_host: int = Field(
        64,
        ge=1,
        description="Python sandboxes running at once on one host, all processes together "
        "(read from the environment by workers/verifiers/slots.py).",
    )
    sandbox_cgroup: str | None = Field(
        None,
        description="A memory cgroup (v2: one delegating `memory`) to make each sandbox's in "
        "(read by workers/verifiers/cgroup.py); unset: the worker's own cgroup.",
    )
