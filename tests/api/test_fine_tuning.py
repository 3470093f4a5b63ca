"""`/v1/fine_tuning/jobs` (method reinforcement) through the official `openai` SDK against a
real API process with no worker (issue 18 item 2): create onto one of our jobs, the mapping
of the hyperparameters and the grader, list with pagination, retrieve, cancel, pause, resume,
events, checkpoints, the fine-tuned model's name, and the 400s and 404s."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import OpenAI
from sqlalchemy import update
from sqlalchemy.orm import Session

from service.core.db import make_engine
from service.core.ids import new_id
from service.models import Checkpoint, Job, JobMetric, JobUsage
from service.models.base import utcnow
from tests.api.conftest import served_over_http
from tests.api.server import LIMITS, settings_of
from tests.api.test_files import rft_lines, upload
from tests.e2e.services import RunningService

api = served_over_http()  # the official SDK speaks HTTP


STRING_CHECK = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}",
                "reference": "{{item.answer}}", "operation": "eq"}  # fmt: skip


def reinforcement(grader: dict[str, Any] | None = None, **hyperparameters: Any) -> Any:
    return {
        "type": "reinforcement",
        "reinforcement": {"grader": grader or STRING_CHECK, "hyperparameters": hyperparameters},
    }


def sdk_for(api: RunningService) -> OpenAI:
    key = api.new_key(f"ft-{secrets.token_hex(4)}")
    return OpenAI(base_url=f"{api.base_url}/v1", api_key=key, max_retries=0)


def create(sdk: OpenAI, model: str, training_file: str, **extra: Any) -> Any:
    extra.setdefault("method", reinforcement(batch_size=2))
    return sdk.fine_tuning.jobs.create(model=model, training_file=training_file, **extra)


@pytest.fixture(scope="module")
def sdk(api: RunningService) -> Iterator[OpenAI]:
    with sdk_for(api) as client:
        yield client


@pytest.fixture(scope="module")
def training_file(sdk: OpenAI) -> str:
    return upload(sdk, rft_lines(5)).id


def seed_success(api: RunningService, ft_job_id: str) -> str:
    """As a worker leaves a finished job: a checkpoint and metrics at its last step, succeeded."""
    job_id = "job_" + ft_job_id.removeprefix("ftjob-")
    engine = make_engine(settings_of(api).effective_database_url)
    ckpt_id = new_id("ckpt")
    with Session(engine) as s, s.begin():
        total = s.get(Job, job_id).total_steps  # type: ignore[union-attr]
        s.add(Checkpoint(id=ckpt_id, job_id=job_id, step=total, epoch=1,
                         object_key=f"jobs/{job_id}/step.tar", size_bytes=3, sha256="0" * 64,
                         format="full"))  # fmt: skip
        metrics = {"loss": 0.5, "reward_mean": 0.75, "kl": float("nan")}
        s.add(JobMetric(job_id=job_id, step=total, epoch=1, metrics=metrics))
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status="succeeded", step=total, finished_at=utcnow())
        )
    engine.dispose()
    return ckpt_id


def test_create_maps_onto_one_of_our_jobs(
    api: RunningService, sdk: OpenAI, training_file: str, chat_model: str
) -> None:
    method = reinforcement(batch_size=2, n_epochs=3, compute_multiplier=0.5,
                           learning_rate_multiplier=20, eval_interval=2,
                           reasoning_effort="low")  # fmt: skip
    job = create(sdk, chat_model, training_file, method=method, suffix="digits", seed=7,
                 metadata={"team": "rl"})  # fmt: skip
    assert job.object == "fine_tuning.job" and job.id.startswith("ftjob-")
    assert (job.status, job.model, job.seed, job.training_file) == (
        "queued", chat_model, 7, training_file)  # fmt: skip
    assert job.fine_tuned_model is None and job.finished_at is None and job.error is None
    assert job.metadata == {"team": "rl"} and isinstance(job.created_at, int)
    assert job.method.type == "reinforcement" and job.method.reinforcement is not None
    hp = job.method.reinforcement.hyperparameters
    assert (hp.batch_size, hp.n_epochs, hp.eval_samples) == (2, 3, "auto")
    assert hp.compute_multiplier == 0.5
    assert job.hyperparameters.n_epochs == 3
    assert job.method.reinforcement.grader.to_dict() == STRING_CHECK

    # one of our jobs: GET /v1/jobs shows it, its grader a pinned openai_grader verifier
    with api.client(sdk.api_key) as client:
        ours = client.get(f"/v1/jobs/{job.model_extra['job']}").json()
        assert ours["id"] in [j["id"] for j in client.get("/v1/jobs").json()["data"]]
        (pin,) = ours["spec"]["verifiers"]
        verifier = client.get(f"/v1/verifiers/{pin['name']}").json()
    assert verifier["kind"] == "openai_grader" and verifier["config"] == STRING_CHECK
    grpo = ours["spec"]["grpo"]
    # 3 epochs over 5 records, 2 a step: 8 steps; G = 8 x 0.5; 1e-5 x 20
    assert (grpo["steps"], grpo["prompts_per_step"], grpo["group_size"]) == (8, 2, 4)
    assert grpo["learning_rate"] == pytest.approx(2e-4) and grpo["seed"] == 7
    assert (ours["spec"]["eval_every"], ours["spec"]["checkpoint_every"]) == (2, 2)
    assert ours["spec"]["dataset"] == "ds_" + training_file.removeprefix("file-")
    assert ours["spec"]["name"] == "digits"

    # the same grader again: the same verifier version, not a new one
    again = create(sdk, chat_model, training_file)
    with api.client(sdk.api_key) as client:
        spec = client.get(f"/v1/jobs/{again.model_extra['job']}").json()["spec"]
    assert spec["verifiers"][0] == pin | {"weight": 1.0}
    for j in (job, again):
        assert sdk.fine_tuning.jobs.cancel(j.id).status == "cancelled"


def test_lifecycle_events_and_list(api: RunningService, chat_model: str) -> None:
    with sdk_for(api) as sdk:
        file_id = upload(sdk, rft_lines(2)).id
        ids = []
        for _ in range(3):
            job = create(sdk, chat_model, file_id)
            ids.append(job.id)
            assert sdk.fine_tuning.jobs.retrieve(job.id).to_dict() == job.to_dict()
            assert sdk.fine_tuning.jobs.pause(job.id).status == "paused"
            assert sdk.fine_tuning.jobs.resume(job.id).status == "queued"
            assert sdk.fine_tuning.jobs.cancel(job.id).status == "cancelled"
        with pytest.raises(openai.ConflictError, match="already cancelled"):
            sdk.fine_tuning.jobs.cancel(ids[0])

        page = sdk.fine_tuning.jobs.list(limit=2)
        assert [j.id for j in page.data] == ids[::-1][:2] and page.has_more is True
        assert [j.id for j in sdk.fine_tuning.jobs.list(limit=2)] == ids[::-1]
        assert [j.id for j in sdk.fine_tuning.jobs.list(after=ids[1]).data] == [ids[0]]

        events = list(sdk.fine_tuning.jobs.list_events(ids[0], limit=2))  # auto-paged
        status = [e for e in events if e.model_extra["event_type"] == "status"]
        assert [e.message for e in status] == [
            "job cancelled", "job resumed; queued", "job paused: requested by the API",
            "job queued"]  # fmt: skip
        assert all(e.object == "fine_tuning.job.event" and e.level == "info" for e in status)
        # this API has no worker: the job's warning says so, at OpenAI's level `warn`
        (unserved,) = [e for e in events if e.model_extra["event_type"] == "no_worker"]
        assert unserved.level == "warn" and "no live worker" in unserved.message
        assert [int(e.id.removeprefix("ftevent-")) for e in events] == sorted(
            (int(e.id.removeprefix("ftevent-")) for e in events), reverse=True
        )


def test_checkpoints_and_the_fine_tuned_model(
    api: RunningService, sdk: OpenAI, training_file: str, chat_model: str
) -> None:
    job = create(sdk, chat_model, training_file, suffix="ckpt")
    ckpt_id = seed_success(api, job.id)
    done = sdk.fine_tuning.jobs.retrieve(job.id)
    assert done.status == "succeeded" and isinstance(done.finished_at, int)
    name = done.fine_tuned_model
    assert name == f"ft:{chat_model}:ckpt:{job.id.removeprefix('ftjob-')}"

    (ckpt,) = sdk.fine_tuning.jobs.checkpoints.list(job.id).data
    assert ckpt.object == "fine_tuning.job.checkpoint" and ckpt.fine_tuning_job_id == job.id
    assert ckpt.fine_tuned_model_checkpoint == ckpt_id and ckpt.step_number == 3
    assert ckpt.metrics.train_loss == 0.5 and ckpt.metrics.step == 3
    assert ckpt.metrics.model_extra["reward_mean"] == 0.75  # ours too; NaN left out
    assert "kl" not in ckpt.metrics.model_extra

    # the name is a model: listed, and resolved by chat completions (this API has no backend:
    # it answers 503 once the model is found; an unknown name is a 404)
    assert name in [m.id for m in sdk.models.list()]
    assert sdk.models.retrieve(name).model_extra["kind"] == "fine_tuned"
    messages = [{"role": "user", "content": "Digit 1:"}]
    with pytest.raises(openai.APIStatusError) as served:
        sdk.chat.completions.create(model=name, messages=messages)  # type: ignore[arg-type]
    assert served.value.status_code == 503
    for other in (name[:-1] + ("0" if name[-1] != "0" else "1"), name.replace(":ckpt:", ":x:")):
        with pytest.raises(openai.NotFoundError):
            sdk.chat.completions.create(model=other, messages=messages)  # type: ignore[arg-type]
    with sdk_for(api) as stranger, pytest.raises(openai.NotFoundError):
        stranger.chat.completions.create(model=name, messages=messages)  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["supervised", "dpo"])
def test_other_methods_are_a_clear_400(
    sdk: OpenAI, training_file: str, chat_model: str, method: str
) -> None:
    with pytest.raises(openai.BadRequestError, match="only reinforcement") as info:
        create(sdk, chat_model, training_file, method={"type": method, method: {}})
    assert info.value.param == "method.type"
    with pytest.raises(openai.BadRequestError, match="only reinforcement"):
        sdk.fine_tuning.jobs.create(model=chat_model, training_file=training_file)


@pytest.mark.parametrize(
    ("grader", "param", "message"),
    [
        ({**STRING_CHECK, "type": "regex_check"}, "method.reinforcement.grader.type",
         "unknown grader type"),
        ({**STRING_CHECK, "reference": "{{answer}}"}, "method.reinforcement.grader.reference",
         "starts with"),
        ({**STRING_CHECK, "reference": "{{item.label}}"}, "method.reinforcement.grader.reference",
         "records 1, 2, 3, 4, 5 of training_file lack"),
        ({"type": "multi", "name": "m", "calculate_output": "a",
          "graders": {"a": {**STRING_CHECK, "input": "{{item.messages}}"}}},
         "method.reinforcement.grader.graders.a.input", "not an item field"),
    ],
)  # fmt: skip
def test_a_bad_grader_is_a_400_at_creation(
    sdk: OpenAI, training_file: str, chat_model: str, grader: Any, param: str, message: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        create(sdk, chat_model, training_file, method=reinforcement(grader))
    assert info.value.param == param and message in info.value.message


def test_another_tenants_job_and_file_are_missing(
    api: RunningService, sdk: OpenAI, training_file: str, chat_model: str
) -> None:
    mine = create(sdk, chat_model, training_file).id
    missing = "ftjob-0000000000000000000000"
    with sdk_for(api) as stranger:
        jobs = stranger.fine_tuning.jobs
        for call in (
            jobs.retrieve,
            jobs.cancel,
            jobs.pause,
            jobs.resume,
            jobs.list_events,
            jobs.checkpoints.list,
        ):
            with pytest.raises(openai.NotFoundError) as theirs:
                call(mine)
            with pytest.raises(openai.NotFoundError) as absent:
                call(missing)
            assert {**theirs.value.body, "message": ""} == {**absent.value.body, "message": ""}
            assert theirs.value.message.replace(mine, "ID") == absent.value.message.replace(
                missing, "ID"
            )
        assert jobs.list().data == []
        with pytest.raises(openai.BadRequestError) as theirs_file:
            create(stranger, chat_model, training_file)
        with pytest.raises(openai.BadRequestError) as absent_file:
            create(stranger, chat_model, "file-0000000000000000000000")
        assert theirs_file.value.param == absent_file.value.param == "training_file"
    assert sdk.fine_tuning.jobs.cancel(mine).status == "cancelled"


def seed_running(api: RunningService, ft_job_id: str, step_seconds: list[float],
                 trained: dict[str, int]) -> None:  # fmt: skip
    """As a worker records steps: their metrics (with `step_seconds`) and usage rows (tokens
    trained, by device kind), the job running at the last of them."""
    job_id = "job_" + ft_job_id.removeprefix("ftjob-")
    engine = make_engine(settings_of(api).effective_database_url)
    with Session(engine) as s, s.begin():
        tenant = s.get(Job, job_id).tenant_id  # type: ignore[union-attr]
        for step, seconds in enumerate(step_seconds, 1):
            s.add(JobMetric(job_id=job_id, step=step, epoch=1,
                            metrics={"step_seconds": seconds, "loss": 0.5}))  # fmt: skip
        for kind, tokens in trained.items():
            s.add(JobUsage(job_id=job_id, day=utcnow().date(), device_kind=kind, tenant_id=tenant,
                           steps=len(step_seconds), device_seconds=1.0, completion_tokens=10,
                           trained_tokens=tokens, verifier_cpu_seconds=0.0))  # fmt: skip
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status="running", epoch=1, step=len(step_seconds), started_at=utcnow())
        )
    engine.dispose()


def test_trained_tokens_and_estimated_finish_come_from_our_records(
    api: RunningService, chat_model: str
) -> None:
    with sdk_for(api) as sdk:
        training_file = upload(sdk, rft_lines(5)).id
        job = create(sdk, chat_model, training_file, method=reinforcement(batch_size=1, n_epochs=3))
        queued = sdk.fine_tuning.jobs.retrieve(job.id)
        assert (queued.trained_tokens, queued.estimated_finish) == (None, None)
        total = queued.model_extra["total_steps"]
        assert total == 15  # 3 epochs over 5 records, 1 a step
        # 12 steps done: the last 10 took 4 s on average (the first two, slow, no longer count)
        seed_running(api, job.id, [100.0, 100.0] + [3.0, 5.0] * 5, {"cpu": 1000, "cuda:x": 234})
        before = time.time()
        running = sdk.fine_tuning.jobs.retrieve(job.id)
        after = time.time()
        assert running.status == "running" and running.trained_tokens == 1234
        assert running.estimated_finish is not None
        assert before + 3 * 4 - 1 <= running.estimated_finish <= after + 3 * 4 + 1
        (listed,) = [j for j in sdk.fine_tuning.jobs.list() if j.id == job.id]
        assert listed.trained_tokens == 1234 and listed.estimated_finish is not None

        seed_success(api, job.id)
        done = sdk.fine_tuning.jobs.retrieve(job.id)
        assert done.status == "succeeded" and done.trained_tokens == 1234
        assert done.estimated_finish is None  # not running


def test_the_open_jobs_limit_is_a_rate_limit_error(api: RunningService, chat_model: str) -> None:
    """The limit refuses at the commit (`service.jobs.open_jobs`), after the route has answered:
    the SDK still gets OpenAI's error, and no job is left behind."""
    limit = int(LIMITS["GRPO_MAX_OPEN_JOBS_PER_TENANT"])
    with sdk_for(api) as client:
        file_id = upload(client, rft_lines(5)).id
        for _ in range(limit):
            create(client, chat_model, file_id)
        with pytest.raises(openai.RateLimitError) as info:
            create(client, chat_model, file_id)
        assert f"the limit is {limit}" in info.value.message
        assert len(client.fine_tuning.jobs.list().data) == limit
