"""Another tenant's id answers 404 exactly like a missing one, on every route with an id."""

from __future__ import annotations

import json
import re

import httpx

from tests.api.conftest import tenant_client
from tests.api.helpers import evaluation_body, job_body
from tests.api.test_downloads import seed_checkpoint
from tests.e2e.services import RunningService

BODIES = {
    "/v1/verifiers/{name}/test": {"samples": [{"prompt": "p", "completion": "c"}]},
    "/v1/environments/{name}/test": {"samples": [{"record": {"prompt": "p"}, "turns": ["c"]}]},
}
ENVIRONMENT = "def step(messages, record):\n    return {'reward': 1.0, 'done': True}\n"


def _shape(r: httpx.Response, ident: str) -> tuple[int, str, str, str]:
    body = r.json()
    return r.status_code, body["type"], body["title"], body["detail"].replace(ident, "ID")


# The seeded job wrote no TensorBoard events: its owner gets the same 404 as everyone, and the
# stranger's answer must still be that of a missing job.
ABSENT_FOR_THE_OWNER = {"/v1/jobs/{job_id}/tensorboard"}


def _fine_tuning_job(client: httpx.Client, model: str) -> tuple[str, str]:
    """An OpenAI file and a fine-tuning job training on it (so the file cannot be deleted)."""
    line = {"messages": [{"role": "user", "content": "Digit 1:"}], "answer": "1"}
    files = {"file": ("t.jsonl", json.dumps(line).encode())}
    r = client.post("/v1/files", data={"purpose": "fine-tune"}, files=files)
    assert r.status_code == 201, r.text
    grader = {"type": "string_check", "name": "em", "input": "{{sample.output_text}}",
              "reference": "{{item.answer}}", "operation": "eq"}  # fmt: skip
    method = {"type": "reinforcement", "reinforcement": {"grader": grader}}
    body = {"model": model, "training_file": r.json()["id"], "method": method}
    job = client.post("/v1/fine_tuning/jobs", json=body)
    assert job.status_code == 201, job.text
    return r.json()["id"], job.json()["id"]


def test_foreign_ids_look_missing_on_every_route(api: RunningService, chat_model: str) -> None:
    owner, stranger = tenant_client(api), tenant_client(api)
    job_id, _ = seed_checkpoint(api, owner, b"tar")
    file_id, fine_tuning_job_id = _fine_tuning_job(owner, chat_model)
    dataset_id = owner.get(f"/v1/jobs/{job_id}").json()["spec"]["dataset"]
    (ckpt,) = owner.get(f"/v1/jobs/{job_id}/checkpoints").json()["data"]
    owned = {
        "model": ckpt["id"],  # /v1/models/{model}: a checkpoint is one of the tenant's models
        "job_id": job_id,
        "dataset_id": dataset_id,
        "file_id": file_id,
        "fine_tuning_job_id": fine_tuning_job_id,
        "name": "em",
        "version": "1",
        "step": "2",
        "preflight_id": owner.post("/v1/jobs/preflight", json=job_body(dataset_id)).json()["id"],
        "webhook_id": owner.post(
            "/v1/webhooks", json={"url": "https://93.184.215.14/h", "events": ["*"]}
        ).json()["id"],
        "evaluation_id": owner.post("/v1/evaluations", json=evaluation_body(dataset_id)).json()[
            "id"
        ],
    }
    missing = {
        "model": "ckpt_0000000000000000000000",
        "job_id": "job_0000000000000000000000",
        "dataset_id": "ds_0000000000000000000000",
        "file_id": "file-0000000000000000000000",
        "fine_tuning_job_id": "ftjob-0000000000000000000000",
        "name": "nobody",
        "version": "1",
        "step": "2",
        "preflight_id": "pf_0000000000000000000000",
        "webhook_id": "wh_0000000000000000000000",
        "evaluation_id": "eval_0000000000000000000000",
    }
    # the owner's secret and environment answer under the same {name} as its verifier
    environment = {"name": "em", "kind": "python", "config": {"source": ENVIRONMENT}}
    assert owner.post("/v1/environments", json=environment).status_code == 201
    assert owner.post("/v1/secrets", json={"name": "em", "value": "s3cret"}).status_code == 200
    paths = api.client(None).get("/openapi.json").json()["paths"]
    checked = 0
    for template, item in paths.items():
        params = re.findall(r"{(\w+)}", template)
        if not params:
            continue
        for method in item:

            def url(
                values: dict[str, str], template: str = template, params: list[str] = params
            ) -> str:
                return template.format(**{p: values[p] for p in params})

            body = BODIES.get(template)
            mine = owner.request(method, url(owned), json=body)
            if template not in ABSENT_FOR_THE_OWNER:
                assert mine.status_code != 404, (method, template, mine.text)
            theirs = stranger.request(method, url(owned), json=body)
            absent = stranger.request(method, url(missing), json=body)
            assert theirs.status_code == 404, (method, template, theirs.text)
            ident = owned[params[0]]
            assert _shape(theirs, ident) == _shape(absent, missing[params[0]]), template
            checked += 1
    assert checked >= 9
