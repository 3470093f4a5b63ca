"""The open-jobs limit is exact: concurrent submissions of one tenant at the edge of the limit
accept exactly as many jobs as the limit leaves room for (GRPO_MAX_OPEN_JOBS_PER_TENANT is 3
in the API tests), on SQLite and on PostgreSQL, through real HTTP from 20 threads (issue 21:
20 simultaneous submissions at a limit of 3 → exactly 3 accepted, 17 answered 429). Before the
count was taken under a lock, 12 concurrent submissions at 1 live job were all accepted."""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx

from tests.api.conftest import tenant_client
from tests.api.helpers import job_body, make_dataset, make_verifier, problem
from tests.api.server import LIMITS
from tests.e2e.services import RunningService

LIMIT = int(LIMITS["GRPO_MAX_OPEN_JOBS_PER_TENANT"])
SUBMISSIONS = 20


def test_concurrent_submissions_never_exceed_the_limit(any_api: RunningService) -> None:
    owner = tenant_client(any_api)
    key = owner.headers["authorization"].split()[1]
    make_verifier(owner)
    dataset = make_dataset(owner)
    body = job_body(dataset)
    start = threading.Barrier(SUBMISSIONS)
    answers: list[httpx.Response] = []
    seconds: list[float] = []

    def submit() -> None:
        with any_api.client(key) as c:  # a connection each: truly concurrent requests
            c.get("/healthz")  # connected before the barrier, so all POSTs start together
            start.wait()
            began = time.perf_counter()
            answers.append(c.post("/v1/jobs", json=body))
            seconds.append(time.perf_counter() - began)

    threads = [threading.Thread(target=submit) for _ in range(SUBMISSIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = Counter(r.status_code for r in answers)
    print(
        f"{SUBMISSIONS} simultaneous submissions at a limit of {LIMIT}: {dict(codes)}, "
        f"slowest answer {max(seconds) * 1000:.0f} ms"
    )
    assert codes == {201: LIMIT, 429: SUBMISSIONS - LIMIT}
    refused = next(r for r in answers if r.status_code == 429)
    assert refused.headers["retry-after"] == LIMITS["GRPO_OPEN_JOBS_RETRY_AFTER_S"]
    assert f"the limit is {LIMIT}" in refused.json()["detail"]
    live = owner.get("/v1/jobs", params={"status": "queued"}).json()["data"]
    assert len(live) == LIMIT
    # A cancelled job frees its place at once.
    assert owner.post(f"/v1/jobs/{live[0]['id']}/cancel").status_code == 202
    assert owner.post("/v1/jobs", json=body).status_code == 201
    assert owner.post("/v1/jobs", json=body).status_code == 429


def _at_the_limit(svc: RunningService) -> tuple[httpx.Client, dict[str, object]]:
    owner = tenant_client(svc)
    make_verifier(owner)
    body = job_body(make_dataset(owner))
    for _ in range(LIMIT):
        assert owner.post("/v1/jobs", json=body).status_code == 201
    return owner, body


def test_a_submission_refused_at_its_commit_leaves_nothing_and_frees_its_key(
    any_api: RunningService,
) -> None:
    """The count runs when the transaction commits, after the job's insert: a refusal rolls the
    job (and its events) back, and releases the idempotency key for the retry."""
    owner, body = _at_the_limit(any_api)
    key = {"Idempotency-Key": "retry-me-later"}
    assert owner.post("/v1/jobs", json=body, headers=key).status_code == 429
    listed = owner.get("/v1/jobs").json()["data"]
    assert len(listed) == LIMIT
    assert owner.post(f"/v1/jobs/{listed[0]['id']}/cancel").status_code == 202
    retried = owner.post("/v1/jobs", json=body, headers=key)
    assert retried.status_code == 201 and "idempotent-replayed" not in retried.headers
    assert len(owner.get("/v1/jobs").json()["data"]) == LIMIT + 1  # the cancelled one and it


def test_a_tenant_refused_a_moment_ago_is_refused_before_validation(
    any_api: RunningService,
) -> None:
    """Under its limit a submission is validated first (no count spent before it); once the
    tenant has been refused, its next submissions are counted before validation, so a flood
    at the limit costs a count each."""
    owner, body = _at_the_limit(any_api)
    bad = {**body, "dataset": "ds_missing"}
    assert problem(owner.post("/v1/jobs", json=bad), 422)["errors"][0]["path"] == "$.dataset"
    assert owner.post("/v1/jobs", json=body).status_code == 429  # counted at the commit
    refused = problem(owner.post("/v1/jobs", json=bad), 429)  # counted before validating
    assert f"the limit is {LIMIT}" in refused["detail"]
