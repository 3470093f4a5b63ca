"""`grpo-service report`: a self-contained HTML report of a finished run, read over the API."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.client.shared import STEPS, Trained


def report(*args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    out = subprocess.run(
        [sys.executable, "-m", "service.cli", "report", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == code, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    return out


def test_report_of_a_finished_run(trained: Trained, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    report(
        trained.job_id, "--out", str(out), "--url", trained.svc.base_url, "--api-key", trained.key
    )
    text = out.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)  # self-contained
    assert f'data-series="train" data-points="{STEPS}"' in text
    assert 'data-series="held-out"' in text and text.count("<svg") >= 6
    with trained.client() as grpo:
        job = grpo.jobs.get(trained.job_id)
        ckpts = grpo.checkpoints.list(trained.job_id)
        verifier = grpo.verifiers.get("digits", 1)
    assert verifier.sha256 in text and job.spec["verifiers"][0]["version"] == 1
    assert all(c.sha256 in text for c in ckpts) and len(ckpts) == STEPS
    assert "checkpoint at step" in text and "succeeded" in text


def test_report_errors_are_messages(trained: Trained, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    bad = report("job_nope", "--out", str(out), "--url", trained.svc.base_url,
                 "--api-key", trained.key, code=1)  # fmt: skip
    assert "404" in bad.stderr and not out.exists()
    key = report(trained.job_id, "--url", trained.svc.base_url, "--api-key", "bad", code=1)
    assert "401" in key.stderr
