"""The Python client against the real service (embedded mode, real HTTP)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest

from grpo_client import ApiError, Client, ConnectionFailed
from grpo_client.models import EventOut
from tests.client.shared import STEPS, Trained, write_jsonl
from tests.e2e.services import free_port

SEVEN = "def verify(prompt, completion, **fields):\n    return float('7' in completion)\n"


def test_verifiers_register_version_test_and_list(clientside: Trained) -> None:
    with clientside.client() as grpo:
        first = grpo.verifiers.create_python("has-seven", SEVEN, "1 if a 7 appears")
        second = grpo.verifiers.create_python("has-seven", SEVEN.replace("7", "8"))
        assert (first.version, second.version) == (1, 2) and first.id.startswith("ver_")
        assert grpo.verifiers.get("has-seven").version == 2
        assert grpo.verifiers.get("has-seven", version=1).config["source"] == SEVEN
        result = grpo.verifiers.test(
            "has-seven",
            [{"prompt": "p", "completion": "x7"}, {"prompt": "p", "completion": "x"}],
            version=1,
        )
        assert result.scores == [1.0, 0.0] and result.errors == [None, None]
        page = grpo.verifiers.list(name="has-seven")
        assert [v.version for v in page.data] == [2, 1] and page.has_more is False

        with pytest.raises(ApiError) as bad:
            grpo.verifiers.create("broken", "python", {"source": "def nope(:\n"})
    assert bad.value.status == 422 and "422" in str(bad.value)


def test_idempotency_key_is_sent_and_replayed(clientside: Trained) -> None:
    with clientside.client() as grpo:
        a = grpo.verifiers.create_python("idem", SEVEN, idempotency_key="same-key-1")
        b = grpo.verifiers.create_python("idem", SEVEN, idempotency_key="same-key-1")
        c = grpo.verifiers.create_python("idem", SEVEN)
    assert a.id == b.id and a.version == 1 and c.version == 2


def test_dataset_upload_and_line_errors(clientside: Trained, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "sevens.jsonl", [{"prompt": f"n{i}", "n": i} for i in range(5)])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"no_prompt": 1}\n')
    with clientside.client() as grpo:
        ds = grpo.datasets.upload(path)
        assert (ds.name, ds.num_records) == ("sevens", 5) and ds.id.startswith("ds_")
        assert ds.sha256 == grpo.datasets.get(ds.id).sha256
        assert ds.id in [d.id for d in grpo.datasets.list(limit=100).data]
        with pytest.raises(ApiError) as err:
            grpo.datasets.upload(bad, name="bad")
    assert err.value.status == 422 and "2" in err.value.message


def test_wait_follows_sse_and_polling_sees_the_same_events(trained: Trained) -> None:
    seen: list[EventOut] = []
    with trained.client() as grpo:
        job = grpo.jobs.wait(trained.job_id, on_event=seen.append, timeout=60)
        polled: list[EventOut] = []
        again = grpo.jobs.wait(trained.job_id, on_event=polled.append, use_sse=False)
    assert job.status == again.status == "succeeded" and job.step == STEPS
    # The stream ends at the final status; polling also returns what came after it (another
    # test of this process may fork the job: a `fork` event on it)
    assert [e.id for e in seen] == [e.id for e in polled if e.id <= seen[-1].id]
    assert all(e.type != "status" for e in polled if e.id > seen[-1].id)
    types = [e.type for e in seen]
    assert types.count("checkpoint") == STEPS and types[-1] == "status"


def test_jobs_get_list_metrics(trained: Trained) -> None:
    with trained.client() as grpo:
        job = grpo.jobs.get(trained.job_id)
        assert job.spec["verifiers"][0]["version"] == 1 and job.total_steps == STEPS
        assert trained.job_id in [j.id for j in grpo.jobs.list(status="succeeded").data]
        rows = grpo.jobs.metrics(trained.job_id)
        assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
        assert all("reward_mean" in r and "eval_reward_mean" in r for r in rows)
        assert [r["step"] for r in grpo.jobs.metrics(trained.job_id, after_step=2)] == [3]
        with pytest.raises(ApiError) as missing:
            grpo.jobs.get("job_doesnotexist")
    assert missing.value.status == 404 and missing.value.problem["status"] == 404


def test_download_checks_sha256_and_resumes_with_range(trained: Trained, tmp_path: Path) -> None:
    ranges: list[tuple[str | None, int]] = []

    def record(response: httpx.Response) -> None:
        if "/download" in response.url.path:
            ranges.append((response.request.headers.get("Range"), response.status_code))

    http = httpx.Client(
        base_url=trained.svc.base_url,
        headers={"Authorization": f"Bearer {trained.key}"},
        event_hooks={"response": [record]},
        follow_redirects=True,
    )
    with Client(trained.svc.base_url, trained.key, http=http) as grpo:
        ckpt = grpo.checkpoints.get(trained.job_id, "latest")
        assert ckpt.step == STEPS
        whole = grpo.checkpoints.download(trained.job_id, dest=str(tmp_path) + "/")
        data = whole.read_bytes()
        assert whole.name == f"{trained.job_id}-step-{STEPS}.tar"
        assert hashlib.sha256(data).hexdigest() == ckpt.sha256 and len(data) == ckpt.size_bytes

        target = tmp_path / "resumed.tar"
        Path(str(target) + ".part").write_bytes(data[: len(data) // 2])
        assert grpo.checkpoints.download(trained.job_id, "latest", target).read_bytes() == data
        assert ranges[-1] == (f"bytes={len(data) // 2}-", 206)

        stale = tmp_path / "stale.tar"
        Path(str(stale) + ".part").write_bytes(b"x" * 1000)  # not a prefix of the archive
        assert grpo.checkpoints.download(trained.job_id, 1, stale).read_bytes() != b""
        assert (
            hashlib.sha256(stale.read_bytes()).hexdigest()
            == grpo.checkpoints.get(trained.job_id, 1).sha256
        )
        assert not Path(str(stale) + ".part").exists()

        with pytest.raises(ApiError) as missing:
            grpo.checkpoints.download(trained.job_id, 99, tmp_path / "none.tar")
    assert missing.value.status == 404


def test_bad_key_and_unreachable_server(clientside: Trained) -> None:
    with Client(clientside.svc.base_url, "grpo_sk_not-a-key") as grpo, pytest.raises(ApiError) as e:
        grpo.jobs.list()
    assert e.value.status == 401
    with (
        Client(f"http://127.0.0.1:{free_port()}", "k", max_retries=2, backoff=0.01) as grpo,
        pytest.raises(ConnectionFailed, match="cannot reach"),
    ):
        grpo.jobs.list()
