"""The record fields a job's verifiers read are checked against its datasets at submission
(POST /v1/jobs, /v1/jobs/preflight, /v1/evaluations): a verifier that reads a field the
records lack is a 422 at its reference naming the field, the fields the records have and the
closest one, instead of a job that errors on every completion. A python verifier's fields are
read from its source without running it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.conftest import tenant_client
from tests.api.helpers import evaluation_body, job_body, problem
from tests.e2e.services import RunningService

READS_KW = "def verify(prompt, completion, **kw):\n    return kw['answer'] == completion\n"


def _verifier(client: httpx.Client, name: str, kind: str, config: dict[str, Any]) -> None:
    r = client.post("/v1/verifiers", json={"name": name, "kind": kind, "config": config})
    assert r.status_code == 201, r.text


def _python(client: httpx.Client, name: str, source: str) -> None:
    _verifier(client, name, "python", {"source": source})


def _dataset(client: httpx.Client, name: str, field: str) -> str:
    records = [{"prompt": f"Digit {d}:", field: str(d)} for d in range(3)]
    r = client.post("/v1/datasets", json={"name": name, "records": records})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _error(r: httpx.Response, path: str) -> str:
    body = problem(r, 422)
    found = [e["message"] for e in body["errors"] if e["path"] == path]
    assert found, body
    return found[0]


def test_a_verifier_reading_a_field_the_records_lack_is_refused(any_api: RunningService) -> None:
    client = tenant_client(any_api)
    _python(client, "reads-answer", READS_KW)
    targets = _dataset(client, "targets", "target")
    body = job_body(targets, verifiers=[{"name": "reads-answer"}])
    for route in ("/v1/jobs", "/v1/jobs/preflight"):
        message = _error(client.post(route, json=body), "$.verifiers[0]")
        assert "verifier 'reads-answer'" in message and "'answer'" in message, message
        assert f"the records of {targets}" in message and "'prompt', 'target'" in message
        assert "did you mean" not in message  # no field is close to `answer`
    evaluation = evaluation_body(targets, verifiers=[{"name": "reads-answer"}])
    message = _error(client.post("/v1/evaluations", json=evaluation), "$.verifiers[0]")
    assert "'answer'" in message and "'prompt', 'target'" in message, message
    assert client.get("/v1/jobs").json()["data"] == []
    assert client.get("/v1/evaluations").json()["data"] == []


@pytest.mark.parametrize(
    ("kind", "config"),
    [
        ("exact_match", {}),  # its field defaults to `answer`
        ("numeric", {"field": "answer"}),
        ("regex", {"pattern": r"(\d)", "group": 1, "field": "answer"}),
        ("python", {"source": "def verify(prompt, completion, answer):\n    return 1.0\n"}),
        ("python", {"source": "def verify(prompt, completion, *, answer):\n    return 1.0\n"}),
    ],
)
def test_each_kind_names_its_field_and_the_closest_one(
    api: RunningService, kind: str, config: dict[str, Any]
) -> None:
    client = tenant_client(api)
    _verifier(client, "v", kind, config)
    answers = _dataset(client, "answers", "answers")
    message = _error(client.post("/v1/jobs", json=job_body(answers, verifiers=[{"name": "v"}])),
                     "$.verifiers[0]")  # fmt: skip
    assert "'answer'" in message and "did you mean 'answers'?" in message, message


def test_a_composite_part_and_an_eval_dataset_are_checked(api: RunningService) -> None:
    client = tenant_client(api)
    _verifier(client, "em", "exact_match", {"field": "answer"})
    _verifier(client, "both", "composite", {"parts": [{"name": "em"}]})
    answers, targets = _dataset(client, "with-answers", "answer"), _dataset(client, "t", "target")
    body = job_body(answers, verifiers=[{"name": "both"}], eval_dataset=targets)
    message = _error(client.post("/v1/jobs", json=body), "$.verifiers[0]")  # eval uses them
    assert "verifier 'both'" in message and targets in message, message
    body["eval_verifiers"] = [{"name": "em", "weight": 1.0}]
    message = _error(client.post("/v1/jobs", json=body), "$.eval_verifiers[0]")
    assert "verifier 'em'" in message and targets in message, message


LENIENT = [  # each reads `answer` only when the record has it
    "def verify(prompt, completion, **kw):\n    return kw.get('answer') == completion\n",
    "def verify(prompt, completion, answer=None, **kw):\n    return answer == completion\n",
    "def verify(prompt, completion, **kw):\n"
    "    if 'answer' in kw:\n        return kw['answer'] == completion\n"
    "    return kw['target'] == completion\n",
    "def verify(prompt, completion, **kw):\n"
    "    try:\n        return kw['answer'] == completion\n"
    "    except KeyError:\n        return kw['target'] == completion\n",
]


def test_only_fields_read_unguarded_are_required(api: RunningService) -> None:
    client = tenant_client(api)
    targets = _dataset(client, "targets", "target")
    for i, source in enumerate(LENIENT):
        _python(client, f"lenient-{i}", source)
        r = client.post("/v1/jobs", json=job_body(targets, verifiers=[{"name": f"lenient-{i}"}]))
        assert r.status_code == 201, (source, r.text)
        cancelled = client.post(f"/v1/jobs/{r.json()['id']}/cancel")  # frees its open-job place
        assert cancelled.status_code == 202, cancelled.text
    _python(client, "strict", LENIENT[2].replace("'answer' in kw", "'target' in kw"))
    body = job_body(targets, verifiers=[{"name": "lenient-0"}, {"name": "strict"}])
    message = _error(client.post("/v1/jobs", json=body), "$.verifiers[1]")
    assert "verifier 'strict'" in message and "'answer'" in message, message
