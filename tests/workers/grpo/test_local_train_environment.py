"""`grpo-service train SPEC --out DIR` with an environment given as a local source file."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from workers.grpo.tiny_model import make_tiny_model
from workers.local_train import LocalSpecError, load_local_job, run_local

EXAMPLE = Path(__file__).parents[3] / "docs" / "examples" / "environments" / "say_it_again.py"


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("local-environment") / "tiny"
    return make_tiny_model(path, hidden_size=64, layers=2, intermediate_size=128)


def _write(tmp_path: Path, model: Path, environment: dict) -> Path:
    (tmp_path / "train.jsonl").write_text(
        "\n".join(json.dumps({"prompt": f"Digit {d}:", "digit": d}) for d in (3, 7)) + "\n"
    )
    spec = {
        "base_model": str(model),
        "dataset": "train.jsonl",
        "environment": environment,
        "grpo": {"steps": 2, "prompts_per_step": 2, "group_size": 2},
        "generation": {"max_new_tokens": 4},
        "checkpoint_every": 1000,
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def test_a_local_environment_file_trains_without_verifiers(small_model, tmp_path) -> None:
    (tmp_path / "env.py").write_text(EXAMPLE.read_text())
    spec = _write(tmp_path, small_model, {"source": "env.py", "max_turns": 2, "timeout_s": 5})
    job = load_local_job(spec)
    assert job.spec.environment.name == "env" and job.spec.environment.max_turns == 2
    assert job.verifiers == [] and job.environment.timeout_s == 5
    out, err = io.StringIO(), io.StringIO()
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a loaded 2-core machine: one thread is faster, same numbers
    try:
        assert run_local(spec, tmp_path / "out", stdout=out, stderr=err) == 2
    finally:
        torch.set_num_threads(before)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    assert all(m["turns_mean"] == 2 and "reward_turn/2" in m for m in lines)


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ({"name": "registered", "max_turns": 2}, "path of its source file"),
        ({"source": "missing.py"}, "no such file"),
        ({"source": "env.py"}, "step(messages, record)"),
    ],
)
def test_bad_local_environments_are_refused(small_model, tmp_path, environment, message) -> None:
    (tmp_path / "env.py").write_text("def reset(record):\n    return 'hi'\n")
    with pytest.raises(LocalSpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_local_job(_write(tmp_path, small_model, environment))
