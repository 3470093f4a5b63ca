"""A job's environment session: the pinned version's sandboxed host, open for one attempt.

A job that names an `environment` trains on its episodes (workers/grpo/episode_rollout.py).
The version was pinned at submission (`environment.version` in the stored spec); its config is
loaded here (`service.environments.service.load_pinned`) and one sandboxed process serves the
whole attempt, closed when the attempt ends however it ends. A version that is gone fails the
job as `missing_reference`; a spent budget as `environment_budget_exceeded`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from service.environments.service import load_pinned
from service.models import Job


@contextmanager
def open_environment(job: Job) -> Iterator[Any]:
    """The job's `SandboxedEnvironment`, or None when the job names no environment."""
    ref = job.spec.get("environment")
    if not ref:
        yield None
        return
    from workers.environments import SandboxedEnvironment

    config = load_pinned(job.tenant_id, ref["name"], ref["version"])
    with SandboxedEnvironment(config, name=f"{ref['name']}@{ref['version']}") as session:
        yield session
