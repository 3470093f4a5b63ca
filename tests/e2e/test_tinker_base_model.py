"""A Tinker run's sampler weights as a GRPO job's `base_model` (issue 35, item 3): trained with
the official SDK against `grpo-service up` (its tinker worker), then fine-tuned by a job on the
same service; another tenant's path is refused exactly as a missing one, and the weights a live
job starts from can be neither deleted nor replaced."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import httpx
import tinker
from tinker import types

from tests.e2e.services import IDLE_QUEUE, TINY, RunningService
from tests.e2e.test_lineage import FROZEN, _assert_same, _download, _weights
from tests.e2e.test_training_flow import submit_digit_job, wait_final

NAME = "for-grpo"


def _train(trainer: tinker.TrainingClient) -> str:
    """Two Adam steps (so the adapter is not the identity), saved for sampling: the path."""
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([5, 9, 13, 17, 21]),
        loss_fn_inputs={"target_tokens": [9, 13, 17, 21, 25], "weights": [1.0] * 5},
    )
    for _ in range(2):
        trainer.forward_backward([datum], "cross_entropy").result()
        trainer.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    return trainer.save_weights_for_sampler(NAME).result().path


def _merged(client: httpx.Client, key: str, path: str, base_dir: Path, into: Path) -> dict:
    """The sampler weights downloaded and merged into the base with peft."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_id, _, name = path.removeprefix("tinker://").split("/")
    archive = client.get(f"/api/v1/training_runs/{run_id}/checkpoints/sampler_weights/{name}"
                         "/archive", headers={"X-API-Key": f"tml-{key}"})  # fmt: skip
    assert archive.status_code == 200, archive.text
    with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
        tar.extractall(into, filter="data")
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    return PeftModel.from_pretrained(base, into).merge_and_unload().state_dict()


def test_a_job_fine_tunes_from_tinker_sampler_weights(
    embedded_service: RunningService, tiny_model_dir: Path, tmp_path: Path
) -> None:
    key = embedded_service.new_key(f"tinker-grpo-{tmp_path.name}")
    sdk = tinker.ServiceClient(base_url=embedded_service.base_url, api_key="tml-" + key)
    client = embedded_service.client(key)
    try:
        trainer = sdk.create_lora_training_client(base_model=TINY, rank=2).result()
        path = _train(trainer)
        merged = _merged(client, key, path, tiny_model_dir, tmp_path / "adapter")

        job = submit_digit_job(client, path, grpo=FROZEN, checkpoint_every=1)
        assert job["spec"]["base_model"] == path and job["parent_checkpoint"] is None
        (pinned,) = job["spec"]["lineage"]  # the checkpoint's id
        assert pinned.startswith("tkc_")
        final = wait_final(client, job["id"])
        assert final["status"] == "succeeded", final["error"]
        # The job started from the run's weights: its checkpoint (lr 1e-9) is base + adapter.
        _assert_same(_weights(_download(client, job["id"], tmp_path / "job")), merged)
        q = "model.layers.0.self_attn.q_proj.weight"
        assert (merged[q] - _weights(tiny_model_dir)[q]).abs().max().item() > 1e-4  # it moved

        # While a job that starts from them is live (queued where no worker listens), the
        # weights can be neither deleted nor saved over; once it is cancelled, they can.
        spec = {k: job["spec"][k] for k in ("base_model", "dataset", "grpo")}
        spec["verifiers"] = [{"name": "digits"}]
        idle = client.post("/v1/jobs", json={**spec, "queue": IDLE_QUEUE})
        assert idle.status_code == 201, idle.text
        archive = f"/api/v1/training_runs/{path.split('/')[2]}/checkpoints/sampler_weights/{NAME}"
        tml = {"X-API-Key": f"tml-{key}"}
        assert client.delete(archive, headers=tml).status_code == 409
        # (over HTTP: the SDK retries a 409, as it would a lock held elsewhere)
        save = {"model_id": trainer.model_id, "path": NAME}
        r = client.post("/api/v1/save_weights_for_sampler", json=save, headers=tml)
        assert r.status_code == 409 and "live job" in r.text, r.text
        assert client.post(f"/v1/jobs/{idle.json()['id']}/cancel").status_code == 202
        assert client.delete(archive, headers=tml).status_code == 204
    finally:
        client.close()
        sdk.close("success").result()


def test_another_tenants_sampler_path_reads_as_a_missing_one(
    embedded_service: RunningService, tmp_path: Path
) -> None:
    owner = embedded_service.new_key(f"owner-{tmp_path.name}")
    sdk = tinker.ServiceClient(base_url=embedded_service.base_url, api_key="tml-" + owner)
    try:
        trainer = sdk.create_lora_training_client(base_model=TINY, rank=1).result()
        path = trainer.save_weights_for_sampler(NAME).result().path
    finally:
        sdk.close("success").result()
    with embedded_service.client(embedded_service.new_key(f"other-{tmp_path.name}")) as other:
        answers = []
        for name in (path, path.replace(NAME, "nothing"), path.replace("sampler_", "")):
            spec = {"base_model": name, "dataset": "digits", "verifiers": [{"name": "digits"}]}
            r = other.post("/v1/jobs", json=spec)
            assert r.status_code == 422, r.text
            (error,) = [e for e in r.json()["errors"] if e["path"] == "$.base_model"]
            answers.append(error["message"].replace(name, "<path>"))
        assert answers[0] == answers[1] == answers[2], answers
