"""Environments from the Python client and the `grpo` CLI, against the real service: register
a .py file (a new version on the same name), read and list the versions, replay scripted turns
with `test` (issue 19)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from grpo_client import ApiError
from tests.client.shared import Trained, write_jsonl
from tests.client.test_cli import grpo

ECHO = '''\
def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()

tools = [shout]

def step(messages, record):
    said = messages[-1]["content"]
    return {"observation": None, "reward": float(said == record["word"].upper()), "done": True}
'''
CALL = '<tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>'


def test_client_registers_versions_and_tests(clientside: Trained, tmp_path: Path) -> None:
    source = tmp_path / "echo.py"
    source.write_text(ECHO)
    with clientside.client() as grpo_client:
        envs = grpo_client.environments
        first = envs.create_from_file(source)
        second = envs.create_python("echo", ECHO, "louder", timeout_s=5)
        assert (first.name, first.version, second.version) == ("echo", 1, 2)
        assert envs.get("echo").sha256 == second.sha256 != first.sha256
        assert envs.get("echo", version=1).config == {"source": ECHO, "timeout_s": 10.0}
        assert [e.version for e in envs.list(name="echo")] == [2, 1]
        result = envs.test("echo", [({"prompt": "Shout hi", "word": "hi"}, [CALL, "HI"])])
        (episode,) = result.results
        assert [m["role"] for m in episode.messages] == ["user", "assistant", "tool", "assistant"]
        assert episode.messages[2]["content"] == "HI" and episode.rewards == [1.0]
        with pytest.raises(ApiError) as bad:
            envs.create_python("broken", "def reset(record):\n    return ''\n")
    assert bad.value.status == 422 and "step(messages, record)" in str(bad.value)


def test_cli_creates_lists_and_tests(clientside: Trained, tmp_path: Path) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    env = {**base, "XDG_CONFIG_HOME": str(tmp_path / "config"), "COLUMNS": "120",
           "GRPO_URL": clientside.svc.base_url, "GRPO_API_KEY": clientside.key}  # fmt: skip
    (tmp_path / "shouter.py").write_text(ECHO)
    made = json.loads(grpo("environments", "create", str(tmp_path / "shouter.py"), "--json",
                           env=env).stdout)  # fmt: skip
    assert made["name"] == "shouter" and made["version"] == 1
    samples = write_jsonl(
        tmp_path / "episodes.jsonl",
        [{"record": {"prompt": "p", "word": "hi"}, "turns": [CALL, "HI"]},
         {"record": {"prompt": "p", "word": "hi"}, "turns": ["hi"]}],
    )  # fmt: skip
    shown = grpo("environments", "test", "shouter", str(samples), env=env).stdout
    assert "2 episodes" in shown and "tool calls" in shown
    listed = grpo("environments", "list", "--name", "shouter", env=env).stdout
    assert "shouter" in listed and made["sha256"][:12] in listed
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "p"}])
    assert "line 1" in grpo("environments", "test", "shouter", str(bad), env=env, code=2).stderr
