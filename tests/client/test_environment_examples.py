"""The worked environments of docs/examples/environments/ through the `grpo` CLI against the
real service: each registers and passes its own episodes file (`/test`: every episode scored,
none erring), and `grpo environments test` exits 1 when every episode errs, as with records
of another shape than the source reads (issue 34)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.client.shared import Trained, write_jsonl
from tests.client.test_cli import grpo

EXAMPLES = Path(__file__).parents[2] / "docs" / "examples" / "environments"


def _env(clientside: Trained, tmp_path: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    return {**base, "XDG_CONFIG_HOME": str(tmp_path / "config"), "COLUMNS": "120",
            "GRPO_URL": clientside.svc.base_url, "GRPO_API_KEY": clientside.key}  # fmt: skip


@pytest.mark.parametrize("example", ["calculator", "say_it_again"])
def test_each_example_passes_its_episodes_file(
    clientside: Trained, tmp_path: Path, example: str
) -> None:
    env = _env(clientside, tmp_path)
    source, episodes = EXAMPLES / f"{example}.py", EXAMPLES / f"{example}.episodes.jsonl"
    name = f"example-{example.replace('_', '-')}"
    grpo("environments", "create", str(source), "--name", name, env=env)
    shown = grpo("environments", "test", name, str(episodes), "--json", env=env).stdout
    results = json.loads(shown)["results"]
    samples = [json.loads(line) for line in episodes.read_text().splitlines()]
    assert len(results) == len(samples) >= 2
    for sample, result in zip(samples, results, strict=True):
        assert result["errors"] == [] and not result["truncated"], result
        assert result["turns"] == len(sample["turns"]) and result["reward"] > 0, result
    assert any(r["tool_calls"] for r in results) == (example == "calculator")


def test_cli_test_exits_1_when_every_episode_errors(clientside: Trained, tmp_path: Path) -> None:
    env = _env(clientside, tmp_path)
    grpo("environments", "create", str(EXAMPLES / "calculator.py"), "--name", "calc-1", env=env)
    # the record shape an older doc showed: no `prompt` for the first turn, no `a` and `b`
    wrong = write_jsonl(
        tmp_path / "wrong.jsonl",
        [{"record": {"question": "2 + 3", "answer": 5}, "turns": ["5"]}] * 2,
    )
    failed = grpo("environments", "test", "calc-1", str(wrong), env=env, code=1)
    assert "2 episodes" in failed.stdout  # the table is still shown
    assert "every episode ended on an error" in failed.stderr
    # one episode scored is a result worth reading, not a failure
    mixed = write_jsonl(
        tmp_path / "mixed.jsonl",
        [{"record": {"question": "2 + 3", "answer": 5}, "turns": ["5"]},
         {"record": {"prompt": "What is 2+3?", "a": 2, "b": 3}, "turns": ["5"]}],
    )  # fmt: skip
    assert "2 episodes" in grpo("environments", "test", "calc-1", str(mixed), env=env).stdout
