"""One run on 1 or 2 processes (torch.distributed, gloo on CPU, FSDP2): the same curve.

The 2-process runs go through the real command (`grpo-service train --nproc 2`: PyTorch's
elastic launcher, two ranks); the 1-process ones through `run_local`, the same code in this
process. The weights are compared with the reference engine on one process: the two-process
run trains through the model's own forward, and the fast engine's forward differs from it by
float rounding, which AdamW's first step (about lr * sign(g) per weight) turns into up to lr
for the weights whose gradient is near its eps (docs/distributed.md has the figures); the
learning rates are low enough that this stays well inside the tolerance.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from service.cli import app
from workers.local_train import run_local

STEPS = 3
# AdamW's first step moves a weight by about lr * sign(g), and by a fraction of lr where |g| is
# near eps: there a rounding-level gradient difference (the order of the sum) moves the weight
# by a fraction of lr. At these rates that stays under 1e-6 while every step is over 5e-5.
LR = {"full": 1e-4, "lora": 1e-3}
TOLERANCE = 1e-5


# Episodes of 1 to 3 turns: one ends at the first turn that holds a digit, the others go on
# ("Again."), so the processes' episodes end at different turns.
AGAIN = """
def step(messages, record):
    said = messages[-1]["content"]
    reward = sum(c == str(record["digit"]) for c in said) / max(1, len(said))
    done = any(c.isdigit() for c in said)
    return {"observation": None if done else "Again.", "reward": reward, "done": done}
"""


def _spec(tmp: Path, model: Path, kind: str, environment: bool = False) -> Path:
    (tmp / "train.jsonl").write_text(
        "".join(json.dumps({"prompt": f"Digit {d}:", "digit": d}) + "\n" for d in range(10))
    )
    spec = {
        "base_model": str(model),
        "dataset": str(tmp / "train.jsonl"),
        "verifiers": [{"kind": "regex", "config": {"pattern": "[0-9]"}, "name": "digit"}],
        "grpo": {"steps": STEPS, "prompts_per_step": 4, "group_size": 4, "learning_rate": LR[kind]},
        "generation": {"max_new_tokens": 8},
        "checkpoint_every": 1,
    }
    if kind == "lora":
        spec["lora"] = {"r": 8, "alpha": 16}
    else:  # a KL term (against the frozen copy): the loss is more than -mean(A) = 0
        spec["grpo"]["beta"] = 0.04
    if environment:  # the verifier scores each final transcript and adds to the episode's reward
        (tmp / "again.py").write_text(AGAIN)
        spec["environment"] = {"source": "again.py", "max_turns": 3}
        spec["eval_dataset"], spec["eval_every"] = spec["dataset"], STEPS
    path = tmp / f"{kind}{'-episodes' if environment else ''}.json"
    path.write_text(json.dumps(spec))
    return path


def _one(spec: Path, out: Path, monkeypatch, engine: str, resume: Path | None = None) -> list:
    monkeypatch.setenv("GRPO_ENGINE", engine)
    stdout = io.StringIO()
    run_local(spec, out, resume_from=resume, stdout=stdout, stderr=io.StringIO())
    return [json.loads(line) for line in stdout.getvalue().splitlines()]


def _two(spec: Path, out: Path) -> list:
    env = os.environ | {"HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "service.cli", "train", str(spec), "--out", str(out)]
    proc = subprocess.run([*cmd, "--nproc", "2"], capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


def _weights(out: Path, step: int) -> dict[str, torch.Tensor]:
    folder = out / "checkpoints" / f"step-{step:06d}"
    name = "adapter_model.safetensors" if (folder / "adapter_config.json").exists() else None
    return load_file(folder / (name or "model.safetensors"))


def _same_curve(one: list, two: list, steps: range) -> None:
    assert [m["step"] for m in two] == list(steps)
    for a, b in zip(one, two, strict=True):
        assert (a["world_size"], b["world_size"]) == (1.0, 2.0)
        for key in ("reward_mean", "reward_std", "reward/digit", "frac_zero_std_groups"):
            assert abs(a[key] - b[key]) <= 1e-4, (a["step"], key, a[key], b[key])
        assert abs(a["loss"] - b["loss"]) <= 1e-3, (a["step"], a["loss"], b["loss"])
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)  # the summed gradient
        assert a["completion_len_mean"] == b["completion_len_mean"]  # the same completions
        assert a["trained_tokens"] == b["trained_tokens"]


def _same_weights(a_out: Path, b_out: Path, step: int) -> dict[str, torch.Tensor]:
    a, b = _weights(a_out, step), _weights(b_out, step)
    assert sorted(a) == sorted(b)  # the gathered folder holds what one process writes
    difference = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"weights after step {step}: largest difference {difference:.2e}")
    assert difference <= TOLERANCE
    return a


def test_full_training_on_two_processes_and_a_resume_on_one(tiny_model, tmp_path, monkeypatch):
    spec = _spec(tmp_path, tiny_model, "full")
    two = _two(spec, tmp_path / "two")
    reference = _one(spec, tmp_path / "ref", monkeypatch, "reference")
    _same_curve(reference, two, range(1, STEPS + 1))
    # the default (fast) engine on one process: the same curve too
    _same_curve(_one(spec, tmp_path / "fast", monkeypatch, "fast"), two, range(1, STEPS + 1))
    after = _same_weights(tmp_path / "ref", tmp_path / "two", 1)
    base = load_file(tiny_model / "model.safetensors")  # the step is far above the tolerance
    assert max((after[k] - base[k]).abs().max().item() for k in after) > 5 * TOLERANCE
    # checkpointed on 2 processes (weights gathered, optimizer shards in dcp/), resumed on 1
    checkpoint = tmp_path / "two" / "checkpoints" / "step-000001"
    assert (checkpoint / "dcp").is_dir() and (checkpoint / "trainer_state.pt").is_file()
    resumed = _one(spec, tmp_path / "resumed", monkeypatch, "reference", resume=checkpoint)
    _same_curve(resumed, two[1:], range(2, STEPS + 1))
    # the optimizer's moments came back from the shards: else step 2's update would differ
    _same_weights(tmp_path / "ref", tmp_path / "resumed", STEPS)
    from transformers import AutoModelForCausalLM  # what a download does with the final one

    AutoModelForCausalLM.from_pretrained(tmp_path / "two" / "checkpoints" / f"step-{STEPS:06d}")


def test_lora_on_two_processes(tiny_model, tmp_path, monkeypatch):
    spec = _spec(tmp_path, tiny_model, "lora")
    two = _two(spec, tmp_path / "two")
    _same_curve(_one(spec, tmp_path / "ref", monkeypatch, "reference"), two, range(1, STEPS + 1))
    after = _same_weights(tmp_path / "ref", tmp_path / "two", 1)
    assert max(after[k].abs().max().item() for k in after if "lora_B" in k) > 5 * TOLERANCE  # B: 0


def test_episodes_on_two_processes(tiny_model, tmp_path, monkeypatch):
    """An environment job (its own sandbox on each process): the same episodes, rewards and
    loss on 2 processes as on 1, though the processes' episodes end at different turns."""
    spec = _spec(tmp_path, tiny_model, "full", environment=True)
    two = _two(spec, tmp_path / "two")
    one = _one(spec, tmp_path / "one", monkeypatch, "reference")
    _same_curve(one, two, range(1, STEPS + 1))
    for a, b in zip(one, two, strict=True):
        for key in (
            "turns_mean",
            "tool_calls_mean",
            "episode_len_mean",
            "reward/environment",
            "reward_turn/1",
            "reward_turn/2",
            "reward_turn/3",
            "tool_error_frac",
        ):
            assert abs(a[key] - b[key]) <= 1e-4, (a["step"], key, a[key], b[key])
    turns = [m["turns_mean"] for m in one]
    print(f"turns_mean per step {turns}; reward_mean {[round(m['reward_mean'], 4) for m in one]}")
    assert any(1 < t < 3 for t in turns)  # episodes of different lengths in one batch
    for key in ("eval_reward_mean", "eval_turns_mean", "eval_episode_len_mean"):
        assert abs(one[-1][key] - two[-1][key]) <= 1e-4, (key, one[-1][key], two[-1][key])


@pytest.mark.parametrize(
    ("nproc", "message"),
    [(8, "more than the step's 4 groups"), (3, "do not split into whole groups across 3")],
)
def test_a_batch_that_does_not_split_is_refused_before_any_process(
    tiny_model, tmp_path, nproc, message
):
    spec = _spec(tmp_path, tiny_model, "full")
    out = tmp_path / "o"
    result = CliRunner().invoke(app, ["train", str(spec), "--out", str(out), "--nproc", str(nproc)])
    assert result.exit_code == 2 and message in result.stderr
    assert not out.exists()


def test_the_ranks_preload_asks_nothing_of_cuda() -> None:
    """The ranks fork from a server that imported the launcher's PRELOAD and the entry modules.
    Had one of those imports asked CUDA anything (even `is_available`, which initialises the
    driver), a rank on a GPU could not initialise CUDA after the fork."""
    code = """
import importlib
import torch

def refuse(*args, **kwargs):
    raise SystemExit("CUDA asked at import")

for name in ("is_available", "device_count", "init", "_lazy_init", "current_device"):
    setattr(torch.cuda, name, refuse)
from workers.grpo.launch import PRELOAD
for module in (*PRELOAD, "workers.local_train", "service.training.ranks"):
    importlib.import_module(module)
print("imported", len(PRELOAD) + 2)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "imported 4" in out.stdout, out.stderr
