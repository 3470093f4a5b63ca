"""`grpo-service train SPEC --out DIR`: the engine without API or queue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli import app
from workers.local_train import LocalSpecError, load_local_job

DIGIT_SOURCE = (
    "def verify(prompt, completion, **fields):\n"
    "    return float(str(fields['digit']) in completion)\n"
)
PYTHON_VERIFIER = {"kind": "python", "config": {"source": DIGIT_SOURCE}, "name": "digit"}
REGEX_VERIFIER = {
    "kind": "regex",
    "config": {"pattern": "[0-9]"},
    "weight": 0.5,
    "name": "has-digit",
}


def _write(tmp_path: Path, model: Path, **overrides) -> Path:
    (tmp_path / "train.jsonl").write_text(
        "\n".join(json.dumps({"prompt": f"Digit {d}:", "digit": d}) for d in (3, 7)) + "\n"
    )
    spec = {
        "base_model": str(model),
        "dataset": "train.jsonl",  # relative to the spec file
        "verifiers": [REGEX_VERIFIER, PYTHON_VERIFIER],
        "grpo": {"steps": 2, "prompts_per_step": 2, "group_size": 4},
        "generation": {"max_new_tokens": 4},
        "checkpoint_every": 1,
        "queue": "gpu",
    } | overrides
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def test_cli_prints_one_json_line_per_step_and_checkpoints(tiny_model, tmp_path):
    spec = _write(tmp_path, tiny_model)
    out = tmp_path / "out"
    # the python verifier runs in bubblewrap where it works, else in the operator-allowed mode
    env = os.environ | {"HF_HUB_OFFLINE": "1", "GRPO_ALLOW_UNSAFE_VERIFIERS": "1"}
    cmd = [sys.executable, "-m", "service.cli", "train", str(spec), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    assert {"reward_mean", "loss", "reward/has-digit", "reward/digit", "errors/digit"} <= set(
        lines[0]
    )
    assert all(m["errors/digit"] == 0 for m in lines)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000001", "step-000002"]
    assert (out / "checkpoints" / "step-000002" / "model.safetensors").exists()


def test_cli_reports_a_bad_spec_in_one_line(tiny_model, tmp_path):
    spec = _write(tmp_path, tiny_model, verifiers=[{"name": "has-digit", "version": 2}])
    result = CliRunner().invoke(app, ["train", str(spec), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and result.stdout == ""
    assert "registry verifier 'has-digit' is not available locally" in result.stderr
    assert not (tmp_path / "o").exists()


def test_spec_with_inline_python_verifier_and_eval_set(tiny_model, tmp_path):
    spec = _write(
        tmp_path,
        tiny_model,
        dataset=str(tmp_path / "train.jsonl"),
        eval_dataset="train.jsonl",
        verifiers=[{"kind": "python", "config": {"source": DIGIT_SOURCE}}, REGEX_VERIFIER],
        eval_verifiers=[{"kind": "regex", "config": {"pattern": "[0-9]"}, "name": "d"}],
        eval_every=1,
    )
    job = load_local_job(spec)
    assert len(job.records) == 2 and job.eval_records == job.records
    assert job.verifiers == [
        {"kind": "python", "config": {"source": DIGIT_SOURCE}, "name": "python-0", "weight": 1.0},
        REGEX_VERIFIER,
    ]
    assert job.eval_verifiers[0]["name"] == "d" and job.spec.eval_every == 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"dataset": "ds_0123456789abcdef"}, "dataset ids need the service"),
        ({"dataset": "missing.jsonl"}, "no such file"),
        ({"verifiers": []}, "non-empty list"),
        ({"verifiers": [{"kind": "regex", "config": {}, "wieght": 1}]}, "unknown fields"),
        ({"verifiers": [{"kind": "composite", "config": {}}]}, "need the registry"),
    ],
)
def test_bad_local_specs_are_refused(tiny_model, tmp_path, overrides, message):
    with pytest.raises(LocalSpecError, match=message):
        load_local_job(_write(tmp_path, tiny_model, **overrides))


def test_training_knobs_are_validated(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="group_size"):
        load_local_job(_write(tmp_path, tiny_model, grpo={"group_size": 1}))


def test_cli_refuses_to_resume_from_a_final_checkpoint(tiny_model, tmp_path):
    spec = _write(tmp_path, tiny_model, verifiers=[REGEX_VERIFIER], keep_checkpoints=1)
    out = tmp_path / "out"
    first = CliRunner().invoke(app, ["train", str(spec), "--out", str(out)])
    assert first.exit_code == 0, first.output
    final = out / "checkpoints" / "step-000002"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000001", final.name]
    assert not (final / "trainer_state.pt").exists()
    result = CliRunner().invoke(
        app, ["train", str(spec), "--out", str(tmp_path / "o2"), "--resume-from", str(final)]
    )
    assert result.exit_code == 2 and result.stdout == ""
    assert "no trainer_state.pt (a final checkpoint" in " ".join(result.stderr.split())
    assert not (tmp_path / "o2").exists()
