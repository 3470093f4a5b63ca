"""A job's transitions racing each other through the API on PostgreSQL: a request that read the
job in one status writes only if the row is still in a status its move leaves, and answers by
the status it found. Each race is made deterministic: another transaction holds the job's row
(a worker finishing it, a claim, a cancel), the request is sent, and that transaction commits
once the request's write waits on its row lock: the request read the job before the commit and
writes after it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest
from sqlalchemy import make_url, text
from sqlalchemy.orm import Session

from service.core.db import make_engine
from service.jobs import lifecycle
from service.models import Job
from tests.api.conftest import tenant_client
from tests.api.helpers import make_dataset, make_job, make_verifier, problem
from tests.e2e.services import RunningService

Write = Callable[[Session], object]


@contextmanager
def _held(svc: RunningService, write: Write) -> Iterator[None]:
    """`write` done in a transaction left open for the block (its row locks held), then
    committed."""
    engine = make_engine(svc.settings().effective_database_url)
    try:
        with Session(engine) as session, session.begin():
            write(session)
            yield
    finally:
        engine.dispose()


def _wait_for_a_lock_wait(svc: RunningService, timeout: float = 20) -> None:
    """Until a session of the service's database waits on a lock (the request's write)."""
    url = svc.settings().effective_database_url
    engine = make_engine(url)
    query = text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = :db AND wait_event_type = 'Lock'"
    )
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                if conn.scalar(query, {"db": make_url(url).database}):
                    return
            time.sleep(0.02)
    finally:
        engine.dispose()
    raise AssertionError("the request never waited on the held row")


def _while_held(
    svc: RunningService, write: Write, request: Callable[[], httpx.Response]
) -> httpx.Response:
    """`request`'s answer, sent while `write`'s transaction held the job's row, which committed
    once the request waited on it."""
    with ThreadPoolExecutor(1) as pool:
        with _held(svc, write):
            answer = pool.submit(request)
            _wait_for_a_lock_wait(svc)
        return answer.result(timeout=60)


def _job(svc: RunningService) -> tuple[httpx.Client, str]:
    client = tenant_client(svc)
    make_verifier(client)
    return client, make_job(client, make_dataset(client))["id"]


def _claimed(svc: RunningService, job_id: str) -> int:
    with svc.session() as session:
        epoch = lifecycle.claim(session, job_id, 600)
    assert epoch is not None
    return epoch


def _statuses(client: httpx.Client, job_id: str) -> list[str]:
    events = client.get(f"/v1/jobs/{job_id}/events").json()["data"]
    return [e["data"]["status"] for e in events if e["type"] == "status"]


@pytest.mark.parametrize(
    ("verb", "refusal"), [("cancel", "already succeeded"), ("pause", "is succeeded")]
)
def test_a_cancel_or_pause_never_overwrites_a_success_committed_after_its_read(
    api_pg: RunningService, verb: str, refusal: str
) -> None:
    """The request read `running`; the run's success commits before its write: 409 naming the
    final status, and the job stays `succeeded`."""
    client, job_id = _job(api_pg)
    epoch = _claimed(api_pg, job_id)

    def succeed(session: Session) -> None:
        assert lifecycle.finish(session, job_id, epoch, "succeeded")

    answer = _while_held(api_pg, succeed, lambda: client.post(f"/v1/jobs/{job_id}/{verb}"))
    assert refusal in problem(answer, 409)["detail"]
    assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded"
    assert _statuses(client, job_id) == ["queued", "running", "succeeded"]


def test_a_cancel_moves_by_the_status_it_finds_not_the_one_it_read(
    api_pg: RunningService,
) -> None:
    """The cancel read `queued`; a worker's claim commits `running` before its write: the job
    is asked to stop (`cancelling`), not marked `cancelled` under a run that goes on."""
    client, job_id = _job(api_pg)

    def claim(session: Session) -> None:
        assert lifecycle.claim(session, job_id, 600) is not None

    cancel = _while_held(api_pg, claim, lambda: client.post(f"/v1/jobs/{job_id}/cancel"))
    assert cancel.status_code == 202 and cancel.json()["status"] == "cancelling", cancel.text
    assert client.get(f"/v1/jobs/{job_id}").json()["finished_at"] is None
    assert _statuses(client, job_id) == ["queued", "running", "cancelling"]


def test_a_resume_that_lost_to_a_cancel_answers_the_final_status(
    api_pg: RunningService,
) -> None:
    client, job_id = _job(api_pg)
    assert client.post(f"/v1/jobs/{job_id}/pause").json()["status"] == "paused"

    def cancel(session: Session) -> None:
        job = session.get(Job, job_id)
        assert job is not None and lifecycle.cancel(session, job).status == "cancelled"

    resume = _while_held(api_pg, cancel, lambda: client.post(f"/v1/jobs/{job_id}/resume"))
    assert f"job '{job_id}' is cancelled, not paused" in problem(resume, 409)["detail"]
    assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"
    assert _statuses(client, job_id) == ["queued", "paused", "cancelled"]
