"""Jobs: submit, read, cancel, pause, resume, fork, and wait for the end (SSE, falling back to
polling)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from grpo_client.errors import ApiError, ClientError, ConnectionFailed
from grpo_client.models import (
    FINAL_STATUSES,
    SETTLED_STATUSES,
    EventOut,
    JobCreate,
    JobOut,
    Page,
)
from grpo_client.preflight import PreflightOut, run_preflight
from grpo_client.rollouts import RolloutPage, download_rollouts, list_rollouts
from grpo_client.sse import parse_sse
from grpo_client.transport import Transport

EventCallback = Callable[[EventOut], None]


class WaitTimeout(ClientError):
    """`jobs.wait` gave up before the job finished."""


class Jobs:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(
        self,
        spec: JobCreate | Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> JobOut:
        """Submit a job: `spec` is a JobCreate or the JSON body as a mapping, or the fields
        come as keywords (`create(base_model="tiny", dataset=ds.id, verifiers=[...])`); the
        server validates it, so its errors list every bad field."""
        if isinstance(spec, JobCreate):
            body = spec.model_dump(mode="json", exclude_unset=True)
        else:
            body = dict(spec or {})
        body |= fields
        data = self._t.json(
            "POST", "/v1/jobs", json=body, creates=True, idempotency_key=idempotency_key
        )
        return JobOut.model_validate(data)

    def preflight(
        self,
        spec: JobCreate | Mapping[str, Any] | None = None,
        *,
        timeout: float | None = 900.0,
        poll_interval: float = 2.0,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> PreflightOut:
        """Pre-flight a job spec (the body of `create`; docs/preflight.md): one real GRPO step
        on a few prompts on a worker, no job created. Returns once it has finished: `status`
        `succeeded` with the figures and `warnings` (`fatal` ones doom the run), or `failed`
        with `error`."""
        if isinstance(spec, JobCreate):
            body = spec.model_dump(mode="json", exclude_unset=True)
        else:
            body = dict(spec or {})
        body |= fields
        return run_preflight(
            self._t, body, timeout=timeout, poll_interval=poll_interval,
            idempotency_key=idempotency_key,
        )  # fmt: skip

    def get(self, job_id: str) -> JobOut:
        return JobOut.model_validate(self._t.json("GET", f"/v1/jobs/{job_id}"))

    def list(
        self, *, status: str | None = None, limit: int = 20, after: str | None = None
    ) -> Page[JobOut]:
        """One page of jobs, newest first (`.data`, `.has_more`, `.next`); iterating it
        walks every later page too: `for job in grpo.jobs.list(status="running"): ...`."""
        params = {k: v for k, v in {"status": status, "after": after}.items() if v}
        data = self._t.json("GET", "/v1/jobs", params={"limit": limit, **params})
        page = Page[JobOut].model_validate(data)
        return page.with_fetcher(lambda nxt: self.list(status=status, limit=limit, after=nxt))

    def cancel(self, job_id: str) -> JobOut:
        return JobOut.model_validate(self._t.json("POST", f"/v1/jobs/{job_id}/cancel"))

    def pause(self, job_id: str) -> JobOut:
        """Pause: a queued job at once, a running one after a checkpoint at its next step
        (`pausing`, then `paused`: its device is free)."""
        return JobOut.model_validate(self._t.json("POST", f"/v1/jobs/{job_id}/pause"))

    def resume(self, job_id: str) -> JobOut:
        """Queue a paused job again; it continues from the checkpoint its pause saved."""
        return JobOut.model_validate(self._t.json("POST", f"/v1/jobs/{job_id}/resume"))

    def fork(
        self,
        job_id: str,
        step: int | str = "latest",
        overrides: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> JobOut:
        """A new job continuing this one from its checkpoint at `step` (or `latest`), with
        `overrides` deep-merged into its spec: `{"grpo": {"learning_rate": 5e-6}}`."""
        body = {"step": step, "overrides": dict(overrides or {})}
        data = self._t.json(
            "POST", f"/v1/jobs/{job_id}/fork", json=body, creates=True,
            idempotency_key=idempotency_key,
        )  # fmt: skip
        return JobOut.model_validate(data)

    def metrics(self, job_id: str, after_step: int = 0) -> list[dict[str, Any]]:
        """One row `{step, ...metrics}` per completed step after `after_step`."""
        data = self._t.json("GET", f"/v1/jobs/{job_id}/metrics", params={"after_step": after_step})
        return list(data["data"])

    def events(self, job_id: str, after: int = 0) -> list[EventOut]:
        data = self._t.json("GET", f"/v1/jobs/{job_id}/events", params={"after": after})
        return [EventOut.model_validate(e) for e in data["data"]]

    def rollouts(
        self,
        job_id: str,
        *,
        step: int | None = None,
        split: str | None = None,
        record: int | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        verifier_error: bool | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> RolloutPage:
        """The completions the job sampled, by step, train before eval, group, index: one page
        (`.data`, `.has_more`, `.next`); iterating it walks every later page, and
        `.to_pandas()` makes a DataFrame of them all."""
        return list_rollouts(
            self._t, job_id, limit=limit, after=after, step=step, split=split, record=record,
            min_reward=min_reward, max_reward=max_reward, verifier_error=verifier_error,
        )  # fmt: skip

    def download_rollouts(self, job_id: str, path: str | Path, *, split: str | None = None) -> Path:
        """Every stored rollout of the job as one Parquet file at `path`."""
        return download_rollouts(self._t, job_id, path, split)

    def wait(
        self,
        job_id: str,
        *,
        timeout: float | None = None,
        on_event: EventCallback | None = None,
        poll_interval: float = 2.0,
        use_sse: bool = True,
        until: Collection[str] = SETTLED_STATUSES,
    ) -> JobOut:
        """Block until the job's status is one of `until` (default: final or paused) and
        return it. Follows the events over SSE (resuming with Last-Event-ID after a drop);
        polls when the stream is unavailable."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last_id = 0
        sse_failures = 0
        while True:
            if use_sse and sse_failures < 3:
                try:
                    last_id = self._follow_sse(job_id, last_id, on_event, deadline, until)
                    sse_failures = 0
                except (ConnectionFailed, _NotSse):
                    sse_failures += 1
            else:
                for event in self.events(job_id, after=last_id):
                    last_id = event.id
                    if on_event:
                        on_event(event)
            job = self.get(job_id)
            if job.status in until:
                if not use_sse or sse_failures:  # polling: pick up the last events too
                    for event in self.events(job_id, after=last_id):
                        last_id = event.id
                        if on_event:
                            on_event(event)
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"job {job_id} is still {job.status} after {timeout} s")
            if not use_sse or sse_failures:
                time.sleep(poll_interval)

    def _follow_sse(
        self,
        job_id: str,
        last_id: int,
        on_event: EventCallback | None,
        deadline: float | None,
        until: Collection[str] = FINAL_STATUSES,
    ) -> int:
        """Read the event stream to its end (the job is final), a status event into `until`
        (the caller then checks the job itself: an old event may be replayed) or the
        deadline; return the last event id seen."""
        headers = {"Accept": "text/event-stream", "Last-Event-ID": str(last_id)}
        read_timeout = (
            60.0 if deadline is None else max(1.0, min(60.0, deadline - time.monotonic()))
        )
        with self._t.stream(
            "GET", f"/v1/jobs/{job_id}/events", headers=headers, timeout=read_timeout
        ) as response:
            if "text/event-stream" not in response.headers.get("content-type", ""):
                raise _NotSse()
            for frame in parse_sse(response.iter_lines()):
                try:
                    event = EventOut.model_validate(json.loads(frame.data))
                except ValueError:
                    continue
                last_id = max(last_id, event.id)
                if on_event:
                    on_event(event)
                if event.type == "status" and (event.data or {}).get("status") in until:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
        return last_id


class _NotSse(Exception):
    """The server answered the events request without a stream."""


__all__ = ["ApiError", "Jobs", "WaitTimeout"]
