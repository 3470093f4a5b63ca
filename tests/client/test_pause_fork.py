"""The client's pause, resume and fork, against the shared service's finished job."""

from __future__ import annotations

import pytest

from grpo_client import ApiError
from tests.client.shared import STEPS, Trained
from tests.e2e.services import IDLE_QUEUE


def test_fork_then_pause_resume_and_cancel_the_fork(trained: Trained) -> None:
    with trained.client() as grpo:
        # On a queue nobody consumes: the fork waits, queued, for the calls below.
        overrides = {"grpo": {"learning_rate": 2e-3}, "queue": IDLE_QUEUE}
        fork = grpo.jobs.fork(trained.job_id, 1, overrides)
        assert fork.forked_from is not None and fork.forked_from.job_id == trained.job_id
        assert (fork.forked_from.step, fork.step, fork.total_steps) == (1, 1, STEPS)
        assert fork.spec["grpo"]["learning_rate"] == 2e-3
        assert grpo.jobs.pause(fork.id).status == "paused"
        assert grpo.jobs.wait(fork.id, timeout=30).status == "paused"  # settled: no timeout
        assert grpo.jobs.resume(fork.id).status == "queued"
        with pytest.raises(ApiError) as caught:
            grpo.jobs.resume(fork.id)
        assert caught.value.status == 409
        assert grpo.jobs.cancel(fork.id).status == "cancelled"
        with pytest.raises(ApiError) as caught:  # the final checkpoint has no trainer state
            grpo.jobs.fork(trained.job_id, "latest")
        assert caught.value.status == 422
