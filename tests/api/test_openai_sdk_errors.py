"""Errors as the official `openai` SDK reads OpenAI's (issue 34 item 5), against a real API: an
unknown model is a `NotFoundError` with code `model_not_found` and param `model`; every error of
`/v1/chat/completions` and `/v1/completions` carries OpenAI's `error` object (`exc.code`,
`exc.param`); a refusal on an `ftjob-` route names the `ftjob-` id, never our `job_` one; a
fine-tuning job of an unknown model is OpenAI's 400 `model_not_found`."""

from __future__ import annotations

import openai
import pytest
from openai import OpenAI

from tests.api.conftest import served_over_http
from tests.api.test_files import rft_lines, upload
from tests.api.test_fine_tuning import create, sdk_for
from tests.e2e.services import TINY, RunningService

api = served_over_http()  # the official SDK speaks HTTP


CHAT = [{"role": "user", "content": "hi"}]


def test_an_unknown_model_is_model_not_found_on_both_routes(api: RunningService) -> None:
    with sdk_for(api) as sdk:
        with pytest.raises(openai.NotFoundError) as chat:
            sdk.chat.completions.create(model="no-such-model", messages=CHAT)
        with pytest.raises(openai.NotFoundError) as text:
            sdk.completions.create(model="ckpt_0000000000000000000000", prompt="x")
    for err in (chat.value, text.value):
        assert (err.status_code, err.code, err.param) == (404, "model_not_found", "model")
        assert err.type == "invalid_request_error"
        assert "grpo models" in err.message  # the hint names a command that exists
    assert "'no-such-model'" in chat.value.message


@pytest.mark.parametrize(
    "model", ["no-such-model", "ckpt_0000000000000000000000", "ft:tiny-chat:x:0000"]
)
def test_fine_tuning_an_unknown_model_is_a_bad_request(api: RunningService, model: str) -> None:
    # OpenAI answers 400 (not 404 as on the completion routes, not our 422) with code
    # model_not_found: the SDK raises BadRequestError and reads code/param from `error`
    with sdk_for(api) as sdk:
        file_id = upload(sdk, rft_lines(2)).id
        with pytest.raises(openai.BadRequestError) as err:
            create(sdk, model, file_id)
    assert (err.value.code, err.value.param, err.value.type) == (
        "model_not_found", "model", "invalid_request_error")  # fmt: skip
    assert f"'{model}'" in err.value.message and "grpo models" in err.value.message
    problem = err.value.response.json()  # still a problem, its field list beside `error`
    assert (problem["status"], [e["path"] for e in problem["errors"]]) == (400, ["$.model"])


def test_a_bad_body_sets_code_and_param(api: RunningService) -> None:
    with sdk_for(api) as sdk:
        with pytest.raises(openai.UnprocessableEntityError) as chat:
            sdk.chat.completions.create(model=TINY, messages=CHAT, temperature=3)
        with pytest.raises(openai.UnprocessableEntityError) as text:
            sdk.completions.create(model=TINY, prompt="x", logprobs=9)
    assert (chat.value.code, chat.value.param) == ("validation_error", "temperature")
    assert (text.value.code, text.value.param) == ("validation_error", "logprobs")
    # the problem stays a problem: its field list is there too
    assert chat.value.response.json()["errors"][0]["path"] == "$.temperature"


def test_no_backend_is_a_server_error_with_its_code(api: RunningService) -> None:
    with sdk_for(api) as sdk, pytest.raises(openai.InternalServerError) as err:
        sdk.chat.completions.create(model=TINY, messages=CHAT)
    assert (err.value.code, err.value.type) == ("service_unavailable", "server_error")


def _refusals(sdk: OpenAI, ft_id: str) -> list[openai.ConflictError]:
    out = []
    for call in (sdk.fine_tuning.jobs.cancel, sdk.fine_tuning.jobs.pause):
        with pytest.raises(openai.ConflictError) as err:
            call(ft_id)
        out.append(err.value)
    with pytest.raises(openai.ConflictError) as resumed:
        sdk.fine_tuning.jobs.resume(ft_id)
    return [*out, resumed.value]


def test_refusals_on_ftjob_routes_name_the_ftjob_id(api: RunningService, chat_model: str) -> None:
    with sdk_for(api) as sdk:
        job = create(sdk, chat_model, upload(sdk, rft_lines(2)).id)
        assert sdk.fine_tuning.jobs.cancel(job.id).status == "cancelled"
        ours = "job_" + job.id.removeprefix("ftjob-")
        refusals = _refusals(sdk, job.id)
    for err in refusals:
        assert job.id in err.message and ours not in str(err.body)
        assert err.code == "conflict"
