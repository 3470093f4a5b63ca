"""`grpo whoami` (GET /v1/me) and `grpo jobs report`: which tenant a key acts for, and a job's
report written from the terminal."""

from __future__ import annotations

import html as _html
import json
import os
from pathlib import Path

import httpx

from tests.client.shared import Trained
from tests.client.test_cli import grpo


def _env(trained: Trained, tmp_path: Path, key: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    return {**base, "XDG_CONFIG_HOME": str(tmp_path / "config"), "GRPO_URL": trained.svc.base_url,
            "GRPO_API_KEY": key}  # fmt: skip


def test_whoami_names_the_tenant_of_each_key_and_never_the_key(
    trained: Trained, tmp_path: Path
) -> None:
    alice, bob = trained.svc.new_key("whoami-alice"), trained.svc.new_key("whoami-bob")
    seen = {}
    for name, key in (("whoami-alice", alice), ("whoami-bob", bob)):
        me = json.loads(grpo("whoami", "--json", env=_env(trained, tmp_path, key)).stdout)
        assert me["tenant"] == name and me["tenant_id"].startswith("ten_"), me
        assert me["key_source"] == "env" and me["url"] == trained.svc.base_url
        assert key.startswith(me["key"]["prefix"]) and key not in json.dumps(me)
        seen[name] = me["tenant_id"]
    assert seen["whoami-alice"] != seen["whoami-bob"]
    text = grpo("whoami", env=_env(trained, tmp_path, alice)).stdout
    assert "whoami-alice" in text and "GRPO_API_KEY" in text
    r = httpx.get(f"{trained.svc.base_url}/v1/me", headers={"Authorization": "Bearer grpo_sk_no"})
    assert r.status_code == 401
    grpo("whoami", env=_env(trained, tmp_path, "grpo_sk_wrong"), code=1)


def test_jobs_report_writes_the_html_of_a_trained_job(trained: Trained, tmp_path: Path) -> None:
    env = _env(trained, tmp_path, trained.key)
    out = tmp_path / "run.html"
    grpo("jobs", "report", trained.job_id, "--out", str(out), env=env)
    html = out.read_text()
    assert trained.job_id in html and "<svg" in html and "Reward mean" in html
    with trained.client() as client:  # the last step's best completion is among the samples
        step = client.jobs.get(trained.job_id).step
        rows = list(client.jobs.rollouts(trained.job_id, step=step, split="train"))
    best = max(rows, key=lambda r: r.reward)
    assert f"<h2>Samples</h2><p>Step {step}: {len(rows)} completions" in html
    assert _html.escape(best.completion[:600]) in html
    assert "http://" not in html.replace(trained.svc.base_url, "")  # loads nothing remote
    other = _env(trained, tmp_path, trained.svc.new_key("report-other"))
    missing = grpo("jobs", "report", trained.job_id, "--out", str(tmp_path / "x.html"),
                   env=other, code=1)  # fmt: skip
    assert "404" in missing.stderr or "not found" in missing.stderr.lower()
    assert not (tmp_path / "x.html").exists()
