"""Names at submission: a mistyped verifier, base model or dataset gets "did you mean" among
the tenant's own names (never another tenant's); a top-level `learning_rate`, as OpenAI's and
TRL's flat configs have it, is pointed to `grpo.learning_rate`; a name uploaded twice names
its newest dataset, older ones their ids."""

from __future__ import annotations

import httpx

from tests.api.conftest import tenant_client
from tests.api.helpers import evaluation_body, job_body, problem
from tests.e2e.services import TINY, RunningService


def _dataset(client: httpx.Client, name: str) -> str:
    records = [{"prompt": f"Digit {d}:", "answer": str(d)} for d in range(2)]
    r = client.post("/v1/datasets", json={"name": name, "records": records})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _verifier(client: httpx.Client, name: str) -> None:
    body = {"name": name, "kind": "exact_match", "config": {"field": "answer"}}
    assert client.post("/v1/verifiers", json=body).status_code == 201


def _messages(r: httpx.Response) -> dict[str, str]:
    return {e["path"]: e["message"] for e in problem(r, 422)["errors"]}


def test_mistyped_names_get_the_closest_of_the_tenants_own(any_api: RunningService) -> None:
    owner, stranger = tenant_client(any_api), tenant_client(any_api)
    _verifier(owner, "gsm8k-answer")
    _dataset(owner, "grade-school-math")
    _verifier(stranger, "secret-grader")
    _dataset(stranger, "secret-records")
    body = job_body("grade-school-mth", base_model=TINY + "y", verifiers=[{"name": "gsm8k-answr"}])
    found = _messages(owner.post("/v1/jobs", json=body))
    assert found["$.verifiers[0].name"].endswith("did you mean 'gsm8k-answer'?"), found
    assert found["$.dataset"].endswith("did you mean 'grade-school-math'?"), found
    assert found["$.base_model"].endswith(f"did you mean '{TINY}'?"), found
    evaluation = evaluation_body("grade-school-mth", verifiers=[{"name": "gsm8k-answr"}])
    found = _messages(owner.post("/v1/evaluations", json=evaluation))
    assert found["$.dataset"].endswith("did you mean 'grade-school-math'?"), found
    assert found["$.verifiers[0].name"].endswith("did you mean 'gsm8k-answer'?"), found
    # another tenant's names, however close, are never offered
    body = job_body("secret-record", verifiers=[{"name": "secret-grade"}])
    found = _messages(owner.post("/v1/jobs", json=body))
    assert found["$.dataset"] == "no dataset 'secret-record'", found
    assert found["$.verifiers[0].name"] == "no verifier secret-grade", found


def test_a_flat_learning_rate_points_to_grpo(api: RunningService) -> None:
    client = tenant_client(api)
    _verifier(client, "em")
    body = {**job_body(_dataset(client, "d")), "learning_rate": 1e-5}
    found = _messages(client.post("/v1/jobs", json=body))
    assert list(found) == ["$.learning_rate"], found
    assert "`grpo.learning_rate`" in found["$.learning_rate"], found


def test_a_name_uploaded_again_names_its_newest_dataset(any_api: RunningService) -> None:
    owner, stranger = tenant_client(any_api), tenant_client(any_api)
    _verifier(owner, "em")
    first, second = _dataset(owner, "train"), _dataset(owner, "train")
    _dataset(stranger, "train")  # newer still, and another tenant's: never chosen
    assert first != second
    r = owner.post("/v1/jobs", json=job_body("train"))
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["dataset"] == second  # the name resolved, the id stored
    assert owner.post(f"/v1/jobs/{r.json()['id']}/cancel").status_code == 202
    assert owner.delete(f"/v1/datasets/{second}").status_code == 204
    r = owner.post("/v1/jobs", json=job_body("train"))
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["dataset"] == first
