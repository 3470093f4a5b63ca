"""The `openai` inference backend (an operator's vLLM or SGLang, issue 18 item 1) through the
official `openai` SDK, against a stand-in vLLM over real HTTP (tests/api/fake_vllm.py):
catalog models by name, a LoRA job's adapter checkpoint unpacked into the shared folder and
loaded once through `/v1/load_lora_adapter` at the path the backend mounts it, then reused;
answers named as the caller named the model; the backend's errors as the SDK's error classes;
a backend that is down a 503, and one that restarted given the adapter again."""

from __future__ import annotations

import io
import secrets
import tarfile
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.core.db import make_engine
from service.core.ids import new_id
from service.models import Checkpoint, Job
from service.models.base import utcnow
from service.storage import open_storage_from_settings
from tests.api.fake_vllm import (
    BROKEN_STREAM_PROMPT,
    FAILING_PROMPT,
    REFUSED_TEMPERATURE,
    FakeVllm,
)
from tests.api.server import run_api, settings_of
from tests.api.test_files import rft_lines, upload
from tests.api.test_fine_tuning import reinforcement
from tests.e2e.services import TINY, RunningService, free_port

TOKEN = secrets.token_urlsafe(16)
CHAT = TINY  # the catalog model the stand-in serves under its name
HI = [{"role": "user", "content": "hi"}]
LOAD = "/v1/load_lora_adapter"


@pytest.fixture(scope="module")
def vllm() -> Iterator[FakeVllm]:
    fake = FakeVllm(free_port(), TOKEN, served={CHAT})
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The adapters' folder as the API writes it, and the same folder where vLLM mounts it."""
    root = tmp_path_factory.mktemp("shared")
    (root / "api-side").mkdir()
    (root / "vllm-side").symlink_to(root / "api-side")
    return root / "api-side", root / "vllm-side"


@pytest.fixture(scope="module")
def api(
    vllm: FakeVllm,
    shared: tuple[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningService]:
    env = {
        "GRPO_INFERENCE_BACKEND": "openai", "GRPO_INFERENCE_URL": vllm.url,
        "GRPO_INFERENCE_TOKEN": TOKEN, "GRPO_INFERENCE_LORA_DIR": str(shared[0]),
        "GRPO_INFERENCE_LORA_BACKEND_DIR": str(shared[1]),
    }  # fmt: skip
    work = tmp_path_factory.mktemp("openai-backend")
    from workers.grpo.tiny_model import make_tiny_model

    # `tiny` with a chat template (OpenAI's fine-tuning files hold chat messages)
    with run_api(env, work, make_tiny_model(work / "chat", chat_template=True)) as svc:
        yield svc


@pytest.fixture(scope="module")
def sdk(api: RunningService) -> Iterator[openai.OpenAI]:
    key = api.new_key(f"vllm-{secrets.token_hex(4)}")
    with openai.OpenAI(base_url=f"{api.base_url}/v1", api_key=key, max_retries=0) as client:
        yield client


def adapter_tar() -> bytes:
    """A stored adapter checkpoint: a tar of adapter_config.json and the weights."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for name, content in (
            ("adapter_config.json", b'{"r": 4}'),
            ("adapter_model.safetensors", b"w"),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return data.getvalue()


def seed_adapter(api: RunningService, ft_job_id: str) -> str:
    """As a worker leaves a LoRA job that succeeded: its adapter checkpoint (a tar of
    adapter_config.json and the weights) in storage, the job succeeded."""
    settings = settings_of(api)
    ckpt_id, job_id = new_id("ckpt"), "job_" + ft_job_id.removeprefix("ftjob-")
    data = io.BytesIO(adapter_tar())
    key = f"jobs/{job_id}/{ckpt_id}.tar"
    open_storage_from_settings(settings).put_bytes(key, data.getvalue())
    engine = make_engine(settings.effective_database_url)
    with Session(engine) as s, s.begin():
        total = s.get(Job, job_id).total_steps  # type: ignore[union-attr]
        s.add(Checkpoint(id=ckpt_id, job_id=job_id, step=total, epoch=1, object_key=key,
                         size_bytes=len(data.getvalue()), sha256="0" * 64,
                         format="peft-adapter"))  # fmt: skip
        s.execute(update(Job).where(Job.id == job_id)
                  .values(status="succeeded", step=total, finished_at=utcnow()))  # fmt: skip
    engine.dispose()
    return ckpt_id


@pytest.fixture(scope="module")
def fine_tuned(api: RunningService, sdk: openai.OpenAI) -> tuple[str, str]:
    """A LoRA fine-tuning job's model name and the adapter checkpoint it stands for."""
    job = sdk.fine_tuning.jobs.create(
        model=CHAT, training_file=upload(sdk, rft_lines(2)).id, suffix="lora",
        method=reinforcement(batch_size=2), extra_body={"lora": {"r": 4, "alpha": 8}},
    )  # fmt: skip
    ckpt = seed_adapter(api, job.id)
    name = sdk.fine_tuning.jobs.retrieve(job.id).fine_tuned_model
    assert name is not None
    return name, ckpt


def test_catalog_models_by_name_streamed_or_not(sdk: openai.OpenAI, vllm: FakeVllm) -> None:
    chat = sdk.chat.completions.create(model=CHAT, messages=HI, max_tokens=3)  # type: ignore[arg-type]
    assert chat.model == CHAT and chat.choices[0].message.content == f"the answer from {CHAT}"
    sent = vllm.bodies("/v1/chat/completions")[-1]
    assert sent == {"model": CHAT, "messages": HI, "max_tokens": 3}  # what was set, no more
    chunks = list(sdk.completions.create(model=CHAT, prompt="2+2=", max_tokens=3, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == f"the answer from {CHAT}"
    assert {c.model for c in chunks} == {CHAT}
    assert vllm.bodies("/v1/completions")[-1]["stream"] is True


def test_an_adapter_is_loaded_once_where_vllm_reads_it_and_answers_under_the_callers_name(
    sdk: openai.OpenAI, vllm: FakeVllm, fine_tuned: tuple[str, str], shared: tuple[Path, Path]
) -> None:
    name, ckpt = fine_tuned
    loads = len(vllm.bodies(LOAD))
    chat = sdk.chat.completions.create(model=name, messages=HI)  # type: ignore[arg-type]
    assert chat.model == name  # vLLM answered for the adapter `ckpt`: renamed as asked
    assert chat.choices[0].message.content == f"the answer from {ckpt}"
    (load,) = vllm.bodies(LOAD)[loads:]
    assert load == {"lora_name": ckpt, "lora_path": str(shared[1] / ckpt)}  # vLLM's mount
    assert (shared[0] / ckpt / "adapter_config.json").read_bytes() == b'{"r": 4}'
    assert vllm.bodies("/v1/chat/completions")[-1]["model"] == ckpt

    chunks = list(sdk.chat.completions.create(model=name, messages=HI, stream=True))  # type: ignore[arg-type]
    assert {c.model for c in chunks} == {name}
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == f"the answer from {ckpt}"
    text = sdk.completions.create(model=ckpt, prompt="x")  # the checkpoint id: named as such
    assert text.model == ckpt and text.choices[0].text == f"the answer from {ckpt}"
    assert len(vllm.bodies(LOAD)) == loads + 1  # loaded once, then reused


def test_backend_errors_are_the_sdks_error_classes(sdk: openai.OpenAI, vllm: FakeVllm) -> None:
    with pytest.raises(openai.BadRequestError) as refused:  # vLLM's older shape: its message
        sdk.chat.completions.create(model=CHAT, messages=HI, temperature=REFUSED_TEMPERATURE)  # type: ignore[arg-type]
    assert refused.value.body["message"] == "temperature is too high for this model"  # type: ignore[index]
    # a catalog model the operator's vLLM does not serve: its 404, with its message
    vllm.served.discard(TINY)
    try:
        with pytest.raises(openai.NotFoundError) as unserved:
            sdk.completions.create(model=TINY, prompt="x")
    finally:
        vllm.served.add(TINY)
    assert unserved.value.body["message"] == f"The model `{TINY}` does not exist."  # type: ignore[index]
    with pytest.raises(openai.InternalServerError) as failed:
        sdk.completions.create(model=CHAT, prompt=FAILING_PROMPT)
    assert failed.value.status_code == 502 and "answered 500" in str(failed.value)
    with pytest.raises(openai.APIError, match="decoding failed"):  # an error chunk mid-stream
        list(sdk.completions.create(model=CHAT, prompt=BROKEN_STREAM_PROMPT, stream=True))


def test_a_backend_down_is_503_and_once_restarted_it_gets_the_adapter_again(
    sdk: openai.OpenAI, vllm: FakeVllm, fine_tuned: tuple[str, str]
) -> None:
    name, ckpt = fine_tuned
    sdk.completions.create(model=name, prompt="x")  # loaded (or already)
    vllm.stop()
    try:
        for model in (CHAT, name):
            for stream in (False, True):
                with pytest.raises(openai.InternalServerError) as down:
                    sdk.completions.create(model=model, prompt="x", stream=stream)
                assert down.value.status_code == 503 and "unreachable" in str(down.value)
                assert down.value.response.headers["retry-after"] == "5"
    finally:
        vllm.start()  # a restarted vLLM: it has forgotten every adapter
    loads = len(vllm.bodies(LOAD))
    out = sdk.completions.create(model=name, prompt="x")  # 404 from vLLM: loaded again
    assert out.model == name and out.choices[0].text == f"the answer from {ckpt}"
    assert [b["lora_name"] for b in vllm.bodies(LOAD)[loads:]] == [ckpt]
    assert vllm.adapters == {ckpt: vllm.bodies(LOAD)[-1]["lora_path"]}


def test_a_tinker_sampler_path_is_loaded_as_an_adapter(
    api: RunningService, vllm: FakeVllm, shared: tuple[Path, Path]
) -> None:
    """A Tinker run's sampler weights (docs/tinker.md), named by their tinker:// path: unpacked
    where vLLM reads them and loaded under their checkpoint id, as a job's adapter."""
    from service.models import Tenant, TinkerCheckpoint, TinkerRun

    tenant_name = f"tinker-vllm-{secrets.token_hex(4)}"
    key = api.new_key(tenant_name)
    settings = settings_of(api)
    ckpt_id, run_id = new_id("tkc"), f"tks_{secrets.token_hex(6)}:train:0"
    object_key = f"tinker/{ckpt_id}.tar"
    open_storage_from_settings(settings).put_bytes(object_key, adapter_tar())
    engine = make_engine(settings.effective_database_url)
    with Session(engine) as s, s.begin():
        tenant = s.scalars(select(Tenant).where(Tenant.name == tenant_name)).one()
        s.add(TinkerRun(id=run_id, tenant_id=tenant.id, base_model=CHAT, lora_rank=4))
        s.flush()
        s.add(TinkerCheckpoint(id=ckpt_id, run_id=run_id, tenant_id=tenant.id, kind="sampler",
                               name="s1", object_key=object_key))  # fmt: skip
    engine.dispose()
    path = f"tinker://{run_id}/sampler_weights/s1"
    with openai.OpenAI(base_url=f"{api.base_url}/v1", api_key=key, max_retries=0) as client:
        out = client.completions.create(model=path, prompt="x")
    assert out.model == path and out.choices[0].text == f"the answer from {ckpt_id}"
    assert vllm.bodies(LOAD)[-1] == {"lora_name": ckpt_id, "lora_path": str(shared[1] / ckpt_id)}
    assert (shared[0] / ckpt_id / "adapter_config.json").read_bytes() == b'{"r": 4}'
