"""One submission cannot open an unbounded number of python sandboxes: a job's python
verifiers and python composite parts, training and evaluation together, and those of one
`/test` call, are capped by GRPO_MAX_PYTHON_SANDBOXES_PER_JOB (8); beyond, a 422 that names
the field. (Before: 16 composites of 32 python parts, 512 sandboxes and as many again for
evaluation, were accepted.)"""

from __future__ import annotations

import httpx

from tests.api.conftest import tenant_client
from tests.api.helpers import error_paths, job_body, make_dataset, make_verifier, problem
from tests.api.server import settings_of
from tests.e2e.services import RunningService

PY = "def verify(prompt, completion, **fields):\n    return 1.0\n"


def _python(client: httpx.Client, name: str) -> None:
    body = {"name": name, "kind": "python", "config": {"source": PY}}
    assert client.post("/v1/verifiers", json=body).status_code == 201


def _composite(client: httpx.Client, name: str, parts: list[str]) -> None:
    config = {"parts": [{"name": p} for p in parts]}
    r = client.post("/v1/verifiers", json={"name": name, "kind": "composite", "config": config})
    assert r.status_code == 201, r.text


def _refs(*names: str) -> list[dict[str, str]]:
    return [{"name": n} for n in names]


def test_a_job_over_the_python_sandbox_cap_is_refused(any_api: RunningService) -> None:
    assert settings_of(any_api).max_python_sandboxes_per_job == 8
    client = tenant_client(any_api)
    make_verifier(client)  # "em", a built-in kind: no sandbox
    _python(client, "py")
    _composite(client, "p16", ["py"] * 16)
    _composite(client, "p32", ["p16", "p16"])  # 32 python leaves: registration accepts it
    _composite(client, "five", ["py"] * 5 + ["em"])
    ds = make_dataset(client)

    # The reproduction: 16 composites of 32 python parts.
    r = client.post("/v1/jobs", json=job_body(ds, verifiers=_refs(*["p32"] * 16)))
    assert problem(r, 422) and error_paths(r) == ["$.verifiers"]
    detail = r.json()["detail"]
    assert "512 python sandboxes" in detail and "at most 8 per job" in detail

    # Nested parts count, and a verifier named twice opens twice: 5 + 1 + 1 + 1 = 8 is the cap.
    r = client.post("/v1/jobs", json=job_body(ds, verifiers=_refs("five", "py", "py", "py", "em")))
    assert r.status_code == 201, r.text
    r = client.post("/v1/jobs", json=job_body(ds, verifiers=_refs("five", "py", "py", "py", "py")))
    assert problem(r, 422) and error_paths(r) == ["$.verifiers"]
    assert "9 python sandboxes" in r.json()["detail"]

    # Evaluation opens its own set: eval_verifiers default to the verifiers, 5 + 5 = 10.
    r = client.post("/v1/jobs", json=job_body(ds, verifiers=_refs("five"), eval_dataset=ds))
    assert problem(r, 422) and error_paths(r) == ["$.eval_verifiers"]
    assert "10 in all, at most 8 per job" in r.json()["detail"]
    # Without an eval_dataset there is no evaluation; with built-in eval_verifiers, none there.
    r = client.post("/v1/jobs", json=job_body(ds, verifiers=_refs("five")))
    assert r.status_code == 201, r.text
    body = job_body(ds, verifiers=_refs("five"), eval_dataset=ds, eval_verifiers=_refs("em"))
    assert client.post("/v1/jobs", json=body).status_code == 201


def test_a_composite_test_over_the_cap_is_refused(any_api: RunningService) -> None:
    client = tenant_client(any_api)
    _python(client, "py")
    _composite(client, "nine", ["py"] * 9)
    _composite(client, "two", ["py", "py"])
    samples = {"samples": [{"prompt": "p", "completion": "c"}]}
    r = client.post("/v1/verifiers/nine/test", json=samples)
    assert problem(r, 422) and error_paths(r) == ["path.name"]
    assert "9 python sandboxes" in r.json()["detail"] and "at most 8" in r.json()["detail"]
    r = client.post("/v1/verifiers/two/test", json=samples)
    assert r.status_code == 200, r.text
    assert r.json()["scores"] == [2.0]


STEP = (
    'def step(messages, record):\n    return {"observation": None, "reward": 1.0, "done": True}\n'
)


def test_a_jobs_environment_counts_as_one_sandbox(any_api: RunningService) -> None:
    """The environment's long-lived sandbox counts like a python verifier's: with it, 8 python
    verifiers are 9 sandboxes; evaluation plays its episodes in the same one."""
    client = tenant_client(any_api)
    _python(client, "py")
    _composite(client, "seven", ["py"] * 7)
    r = client.post("/v1/environments", json={"name": "e", "kind": "python",
                                              "config": {"source": STEP}})  # fmt: skip
    assert r.status_code == 201, r.text
    ds = make_dataset(client)
    env = {"name": "e", "max_turns": 2}

    r = client.post("/v1/jobs", json=job_body(ds, verifiers=_refs("seven"), environment=env))
    assert r.status_code == 201, r.text  # 7 + the environment's = 8, the cap
    r = client.post("/v1/jobs", json=job_body(ds, verifiers=_refs("seven", "py"), environment=env))
    assert problem(r, 422) and error_paths(r) == ["$.verifiers"]
    detail = r.json()["detail"]
    assert "9 python sandboxes" in detail and "the environment's is one" in detail
    # the same verifiers without the environment: 8, accepted
    r = client.post("/v1/jobs", json=job_body(ds, verifiers=_refs("seven", "py")))
    assert r.status_code == 201, r.text
    # evaluation's verifiers open their own set, the environment is counted once: 1 + 7 + 1 = 9
    body = job_body(ds, verifiers=[], environment=env, eval_dataset=ds,
                    eval_verifiers=_refs("seven", "py"))  # fmt: skip
    r = client.post("/v1/jobs", json=body)
    assert problem(r, 422) and error_paths(r) == ["$.eval_verifiers"]
    assert "besides the 1 of verifiers and the environment" in r.json()["detail"]
    body["eval_verifiers"] = _refs("seven")
    assert client.post("/v1/jobs", json=body).status_code == 201
