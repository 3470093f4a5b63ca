"""What a newcomer's mistakes are told (issue 34 item 6), against a real API: an unknown field
names the field it was probably meant to be, a job without a reward says what to add, and the
unknown-model message points at `grpo models`, a command that exists and lists the catalog."""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from tests.api.conftest import served_over_http
from tests.api.helpers import job_body, make_dataset, make_verifier
from tests.client.test_cli import grpo
from tests.e2e.services import TINY, RunningService

api = served_over_http()  # the `grpo` CLI is a process of its own


def _errors(r: httpx.Response) -> dict[str, str]:
    assert r.status_code == 422, r.text
    return {e["path"]: e["message"] for e in r.json()["errors"]}


def test_an_unknown_field_suggests_the_closest_one(api: RunningService) -> None:
    client = api.client(api.new_key("wording-typo"))
    make_verifier(client)
    body = job_body(make_dataset(client))
    body["grpo"] = {"steps": 2, "group_sise": 4}
    body["verifers"] = [{"name": "em"}]
    errors = _errors(client.post("/v1/jobs", json=body))
    assert errors["$.grpo.group_sise"] == "unknown field: did you mean `group_size`?"
    assert errors["$.verifers"] == "unknown field: did you mean `verifiers`?"
    # nothing close: the object's fields are listed instead
    body = job_body(make_dataset(client), resources={"zzzzzz": 1})
    message = _errors(client.post("/v1/jobs", json=body))["$.resources.zzzzzz"]
    assert message.startswith("unknown field; this object takes `")


def test_a_job_without_a_reward_says_what_to_add(api: RunningService) -> None:
    client = api.client(api.new_key("wording-reward"))
    body = job_body(make_dataset(client), verifiers=[])
    message = _errors(client.post("/v1/jobs", json=body))["$.verifiers"]
    assert not message.startswith("Value error")
    assert "grpo verifiers create" in message and "environment" in message


def test_the_unknown_model_hint_names_grpo_models_which_lists_them(
    api: RunningService, tmp_path: Path
) -> None:
    key = api.new_key("wording-models")
    client = api.client(key)
    make_verifier(client)
    body = job_body(make_dataset(client), base_model="no-such-model")
    message = _errors(client.post("/v1/jobs", json=body))["$.base_model"]
    assert "`grpo models`" in message
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    env = {**base, "XDG_CONFIG_HOME": str(tmp_path), "COLUMNS": "200"}
    env |= {"GRPO_URL": api.base_url, "GRPO_API_KEY": key}
    listed = grpo("models", env=env).stdout
    assert listed.split()[:6] == ["id", "kind", "root", "parameters", "context", "chat"]
    assert TINY in listed.split()
    as_json = grpo("models", "--json", env=env).stdout
    assert f'"id": "{TINY}"' in as_json and '"kind": "base"' in as_json
