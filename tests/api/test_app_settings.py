"""An app runs on the settings it was made with (`create_app(settings)`), not on its process's:
two apps in one process, each on its own database and broker, never see each other's."""

from __future__ import annotations

import time
from pathlib import Path

from tests.api.helpers import make_dataset, make_job, make_verifier
from tests.api.server import serve_in_process


def _messages(data_dir: str) -> list[Path]:
    return sorted((Path(data_dir) / "broker" / "queue").glob("*.msg"))


def test_two_apps_in_one_process_keep_to_their_own_settings(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    with (
        serve_in_process({}, tmp_path / "a", tiny_model_dir) as a,
        serve_in_process({"GRPO_MAX_DATASET_RECORDS": "1"}, tmp_path / "b") as b,
    ):
        key_a, key_b = a.new_key("tenant-a"), b.new_key("tenant-b")
        with a.client(key_a) as client_a, b.client(key_b) as client_b:
            assert client_a.get("/v1/me").json()["tenant"] == "tenant-a"
            assert client_b.get("/v1/me").json()["tenant"] == "tenant-b"
            with a.client(key_b) as stranger:  # b's key is unknown to a's database
                assert stranger.get("/v1/me").status_code == 401
            # Each app's own limits: b refuses a dataset of two records, a takes it.
            assert client_b.post("/v1/datasets", json={"name": "d", "records": [
                {"prompt": "1"}, {"prompt": "2"}]}).status_code == 422  # fmt: skip
            make_verifier(client_a)
            job = make_job(client_a, make_dataset(client_a, n=2))

        # The job's wake-up went to a's broker (its data folder), published off the request.
        deadline = time.monotonic() + 10
        while not _messages(a.env["GRPO_DATA_DIR"]):
            assert time.monotonic() < deadline, f"no wake-up in a's broker for {job['id']}"
            time.sleep(0.05)
        assert job["id"] in _messages(a.env["GRPO_DATA_DIR"])[0].read_text()
        assert _messages(b.env["GRPO_DATA_DIR"]) == []
