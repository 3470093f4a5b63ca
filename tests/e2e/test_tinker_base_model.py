"""A Tinker run's sampler weights as a GRPO job's `base_model` (issue 35, item 3): trained with
the official SDK against `grpo-service up` (its tinker worker), then fine-tuned by a job on the
same service; another tenant's path is refused exactly as a missing one."""

from __future__ import annotations

from pathlib import Path

import tinker
from tinker import types

from tests.e2e.services import TINY, RunningService
from tests.e2e.test_lineage import FROZEN, _assert_same, _download, _weights
from tests.e2e.test_training_flow import submit_digit_job, wait_final


def _sampler_weights(svc: RunningService, key: str) -> str:
    """A rank-2 run moved by two Adam steps (so its adapter is not the identity), saved for
    sampling: its tinker:// path."""
    client = tinker.ServiceClient(base_url=svc.base_url, api_key="tml-" + key)
    try:
        trainer = client.create_lora_training_client(base_model=TINY, rank=2).result()
        datum = types.Datum(
            model_input=types.ModelInput.from_ints([5, 9, 13, 17, 21]),
            loss_fn_inputs={"target_tokens": [9, 13, 17, 21, 25], "weights": [1.0] * 5},
        )
        for _ in range(2):
            trainer.forward_backward([datum], "cross_entropy").result()
            trainer.optim_step(types.AdamParams(learning_rate=5e-2)).result()
        return trainer.save_weights_for_sampler("for-grpo").result().path
    finally:
        client.close("success").result()


def test_a_job_fine_tunes_from_tinker_sampler_weights(
    embedded_service: RunningService, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    key = embedded_service.new_key(f"tinker-grpo-{tmp_path.name}")
    path = _sampler_weights(embedded_service, key)
    with embedded_service.client(key) as client:
        run_id, _, name = path.removeprefix("tinker://").split("/")
        archive = client.get(f"/api/v1/training_runs/{run_id}/checkpoints/sampler_weights/"
                             f"{name}/archive", headers={"X-API-Key": f"tml-{key}"})  # fmt: skip
        assert archive.status_code == 200, archive.text
        adapter = tmp_path / "adapter"
        _untar(archive.content, adapter)
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        merged = PeftModel.from_pretrained(base, adapter).merge_and_unload().state_dict()

        job = submit_digit_job(client, path, grpo=FROZEN, checkpoint_every=1)
        assert job["spec"]["base_model"] == path and job["parent_checkpoint"] is None
        (pinned,) = job["spec"]["lineage"]  # the checkpoint's id: the path may be overwritten
        assert pinned.startswith("tkc_")
        final = wait_final(client, job["id"])
        assert final["status"] == "succeeded", final["error"]
        # The job started from the run's weights: its checkpoint (lr 1e-9) is base + adapter.
        _assert_same(_weights(_download(client, job["id"], tmp_path / "job")), merged)
        q = "model.layers.0.self_attn.q_proj.weight"
        assert (merged[q] - _weights(tiny_model_dir)[q]).abs().max().item() > 1e-4  # it moved

    # Another tenant's path, and a path that names nothing, read the same.
    with embedded_service.client(embedded_service.new_key(f"stranger-{tmp_path.name}")) as other:
        answers = []
        for name in (path, path.replace("for-grpo", "nothing")):
            spec = {"base_model": name, "dataset": "digits", "verifiers": [{"name": "digits"}]}
            r = other.post("/v1/jobs", json=spec)
            assert r.status_code == 422, r.text
            (error,) = [e for e in r.json()["errors"] if e["path"] == "$.base_model"]
            answers.append(error["message"].replace(name, "<path>"))
        assert answers[0] == answers[1]


def _untar(data: bytes, into: Path) -> None:
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
