"""`POST /v1/jobs/{id}/pause|resume|fork` through the API alone (no worker: the jobs sit on a
queue nobody consumes), their refusals and the fork's lineage."""

from __future__ import annotations

import httpx

from tests.api.conftest import tenant_client
from tests.api.helpers import make_dataset, make_job, make_verifier, problem
from tests.api.test_checkpoint_delete import add_checkpoint
from tests.e2e.services import RunningService


def _parent(svc: RunningService, client: httpx.Client, steps: list[int]) -> dict:
    """A queued 4-step job with checkpoints at `steps` (as its worker would have left them)."""
    make_verifier(client)
    job = make_job(
        client, make_dataset(client), grpo={"steps": 4, "prompts_per_step": 1, "group_size": 2}
    )
    for step in steps:
        add_checkpoint(svc, job["id"], step)
    return job


def _status_events(client: httpx.Client, job_id: str) -> list[str]:
    events = client.get(f"/v1/jobs/{job_id}/events").json()["data"]
    return [e["data"]["status"] for e in events if e["type"] == "status"]


def test_pause_resume_and_their_conflicts(any_api: RunningService) -> None:
    client = tenant_client(any_api)
    job = _parent(any_api, client, [])
    r = client.post(f"/v1/jobs/{job['id']}/pause")
    assert r.status_code == 200 and r.json()["status"] == "paused", r.text
    assert client.get("/v1/jobs?status=paused").json()["data"][0]["id"] == job["id"]
    assert "paused" in problem(client.post(f"/v1/jobs/{job['id']}/pause"), 409)["detail"]
    r = client.post(f"/v1/jobs/{job['id']}/resume")
    assert r.status_code == 200 and r.json()["status"] == "queued", r.text
    assert "not paused" in problem(client.post(f"/v1/jobs/{job['id']}/resume"), 409)["detail"]
    assert client.post(f"/v1/jobs/{job['id']}/pause").json()["status"] == "paused"
    assert client.post(f"/v1/jobs/{job['id']}/cancel").json()["status"] == "cancelled"
    problem(client.post(f"/v1/jobs/{job['id']}/pause"), 409)
    problem(client.post(f"/v1/jobs/{job['id']}/resume"), 409)
    assert _status_events(client, job["id"]) == [
        "queued", "paused", "queued", "paused", "cancelled",
    ]  # fmt: skip


def test_a_paused_job_holds_no_open_jobs_place_until_it_resumes(api: RunningService) -> None:
    client = tenant_client(api)  # the API's limit: 3 open jobs per tenant
    jobs = [_parent(api, client, []) for _ in range(3)]
    assert client.post(f"/v1/jobs/{jobs[0]['id']}/pause").status_code == 200
    fourth = _parent(api, client, [])  # the paused job's place is free
    r = client.post(f"/v1/jobs/{jobs[0]['id']}/resume")
    assert problem(r, 429) and r.headers["Retry-After"] == "7"
    assert client.get(f"/v1/jobs/{jobs[0]['id']}").json()["status"] == "paused"
    client.post(f"/v1/jobs/{fourth['id']}/cancel")
    assert client.post(f"/v1/jobs/{jobs[0]['id']}/resume").json()["status"] == "queued"


def test_another_tenants_job_cannot_be_paused_resumed_or_forked(api: RunningService) -> None:
    owner, stranger = tenant_client(api), tenant_client(api)
    job = _parent(api, owner, [1])
    for action, body in (("pause", None), ("resume", None), ("fork", {"step": 1})):
        theirs = stranger.post(f"/v1/jobs/{job['id']}/{action}", json=body)
        absent = stranger.post(f"/v1/jobs/job_0000000000000000000000/{action}", json=body)
        assert problem(theirs, 404)["detail"].replace(job["id"], "ID") == problem(absent, 404)[
            "detail"
        ].replace("job_0000000000000000000000", "ID")
    assert owner.get(f"/v1/jobs/{job['id']}").json()["status"] == "queued"


def test_a_fork_keeps_the_spec_changes_the_overrides_and_records_lineage(
    any_api: RunningService,
) -> None:
    client = tenant_client(any_api)
    parent = _parent(any_api, client, [1, 2])
    (point, _) = client.get(f"/v1/jobs/{parent['id']}/checkpoints").json()["data"]
    overrides = {"grpo": {"learning_rate": 5e-3, "beta": 0.0, "steps": 6}, "name": "lr-5e-3"}
    r = client.post(f"/v1/jobs/{parent['id']}/fork", json={"step": 1, "overrides": overrides})
    assert r.status_code == 201, r.text
    fork = r.json()
    assert fork["id"] != parent["id"] and fork["status"] == "queued"
    assert fork["forked_from"] == {"job_id": parent["id"], "step": 1, "checkpoint_id": point["id"]}
    assert (fork["step"], fork["total_steps"]) == (1, 6)  # it goes on from step 2
    expected = {**parent["spec"], "name": "lr-5e-3"}
    expected["grpo"] = {**parent["spec"]["grpo"], "learning_rate": 5e-3, "beta": 0.0, "steps": 6}
    assert {k: v for k, v in fork["spec"].items() if k != "lineage"} == {
        k: v for k, v in expected.items() if k != "lineage"
    }  # the verifiers pinned to the parent's versions, the data and the model unchanged
    assert client.get(f"/v1/jobs/{fork['id']}").json()["forked_from"] == fork["forked_from"]
    events = client.get(f"/v1/jobs/{parent['id']}/events").json()["data"]
    assert [e["data"]["fork"] for e in events if e["type"] == "fork"] == [fork["id"]]

    # the fork point stays while the fork is unfinished, even though its parent moved past it
    body = problem(client.delete(f"/v1/jobs/{parent['id']}/checkpoints/1"), 409)
    assert "fork point" in body["detail"]
    assert client.post(f"/v1/jobs/{fork['id']}/cancel").json()["status"] == "cancelled"
    assert client.delete(f"/v1/jobs/{parent['id']}/checkpoints/1").status_code == 204


def test_fork_refusals(api: RunningService) -> None:
    client = tenant_client(api)
    parent = _parent(api, client, [1, 4])  # 4: the final checkpoint (no trainer state)

    def fork(**body: object) -> httpx.Response:
        return client.post(f"/v1/jobs/{parent['id']}/fork", json=body)

    assert "checkpoint" in problem(fork(step=3), 404)["detail"]  # no checkpoint at step 3
    r = fork(step="latest")
    assert [e["path"] for e in problem(r, 422)["errors"]] == ["$.step"]
    assert "final checkpoint" in r.json()["detail"]
    r = fork(step=1, overrides={"dataset": "ds_x", "grpo": {"seed": 3, "beta": 0.1}, "lora": {}})
    paths = [e["path"] for e in problem(r, 422)["errors"]]
    assert paths == ["$.overrides.dataset", "$.overrides.grpo.seed", "$.overrides.lora"]
    assert "grpo.learning_rate" in r.json()["errors"][0]["message"]  # says what is allowed
    r = fork(step=1, overrides={"grpo": {"learning_rate": -1, "clip_epsilon": 2}})
    paths = sorted(e["path"] for e in problem(r, 422)["errors"])
    assert paths == ["$.overrides.grpo.clip_epsilon", "$.overrides.grpo.learning_rate"]
    r = fork(step=1, overrides={"grpo": {"steps": 1}})
    assert [e["path"] for e in problem(r, 422)["errors"]] == ["$.overrides.grpo.steps"]
    r = fork(step=1, overrides={"verifiers": [{"name": "nobody"}]})
    assert [e["path"] for e in problem(r, 422)["errors"]] == ["$.overrides.verifiers[0].name"]
    r = fork(step=1, overrides={"grpo": 3})
    assert [e["path"] for e in problem(r, 422)["errors"]] == ["$.overrides.grpo"]
    assert [e["path"] for e in problem(fork(step=0), 422)["errors"]] == ["$.step"]
    assert [e["path"] for e in problem(fork(), 422)["errors"]] == ["$.step"]
    jobs = client.get("/v1/jobs").json()["data"]
    assert [j["id"] for j in jobs] == [parent["id"]]  # no refusal left a job behind


AGAIN = """\
def step(messages, record):
    reward = float(len(messages) > 2)
    return {"observation": None if reward else "Again.", "reward": reward, "done": bool(reward)}
"""


def test_a_fork_keeps_the_parents_pinned_environment(any_api: RunningService) -> None:
    """The parent's environment version and sha256 stay pinned in the fork's stored spec, even
    when a newer version has been registered since (as verifiers' pins do)."""
    client = tenant_client(any_api)

    def register(timeout_s: int) -> dict:
        config = {"source": AGAIN, "timeout_s": timeout_s}
        r = client.post("/v1/environments", json={"name": "again", "kind": "python",
                                                  "config": config})  # fmt: skip
        assert r.status_code == 201, r.text
        return r.json()

    first = register(5)
    parent = make_job(
        client, make_dataset(client), verifiers=[], environment={"name": "again", "max_turns": 3},
        grpo={"steps": 4, "prompts_per_step": 1, "group_size": 2},
    )  # fmt: skip
    assert parent["spec"]["environment_sha256"] == first["sha256"]
    add_checkpoint(any_api, parent["id"], 1)
    newer = register(7)
    assert newer["version"] == 2 and newer["sha256"] != first["sha256"]
    r = client.post(f"/v1/jobs/{parent['id']}/fork", json={"step": 1, "overrides": {"name": "f"}})
    assert r.status_code == 201, r.text
    spec = r.json()["spec"]
    assert spec["environment"] == {"name": "again", "version": 1, "max_turns": 3}
    assert spec["environment_sha256"] == first["sha256"]
    stored = client.get(f"/v1/jobs/{r.json()['id']}").json()["spec"]
    assert stored["environment"] == spec["environment"]
    assert stored["environment_sha256"] == first["sha256"]
    assert {k: v for k, v in spec.items() if k not in ("lineage", "name")} == {
        k: v for k, v in parent["spec"].items() if k not in ("lineage", "name")
    }
