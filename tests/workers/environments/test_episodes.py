"""The episode loop over a real sandboxed environment (bubblewrap), driven by ScriptedPolicy:
the calculator tool task, the two-turn "say it again" task, and every bad input of issue 19."""

import textwrap
import time

import pytest

from workers.environments import EnvironmentConfig, SandboxedEnvironment, ScriptedPolicy
from workers.environments import run_episodes as run

CALCULATOR = '''
def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b

def divide(a: float, b: float = 1.0) -> float:
    """Divide a by b."""
    return a / b

tools = [add, divide]

def step(messages, record):
    answer = messages[-1]["content"].strip()
    right = answer == record["answer"]
    return {"observation": None, "reward": 1.0 if right else 0.0, "done": True}
'''

SAY_IT_AGAIN = """
def reset(record):
    return "Say " + record["word"] + "."

def step(messages, record):
    said = sum(m["role"] == "assistant" for m in messages)
    right = messages[-1]["content"].strip() == record["word"]
    if said == 1:
        return {"observation": "Say it again.", "reward": 0.5 * right, "done": False}
    return {"observation": None, "reward": 0.5 * right, "done": True}
"""


def env(source: str, **config) -> SandboxedEnvironment:
    return SandboxedEnvironment(EnvironmentConfig(source=textwrap.dedent(source), **config))


def call(name: str, **arguments) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture(scope="module")
def calculator():
    with env(CALCULATOR) as e:
        yield e


def test_calculator_tools_are_listed_from_hints_and_docstrings(calculator):
    add, divide = calculator.tools()
    assert add["function"] == {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "number", "description": "the first number"},
                "b": {"type": "number", "description": "the second number"},
            },
            "required": ["a", "b"],
        },
    }
    assert divide["function"]["parameters"]["required"] == ["a"]  # b has a default


def test_calculator_task_runs_tools_and_scores_the_final_answer(calculator):
    records = [{"prompt": "2+3?", "answer": "5.0"}, {"prompt": "7/0?", "answer": "inf"}]
    policy = ScriptedPolicy(
        [
            [call("add", a=2, b=3.0), "5.0"],
            [call("divide", a=7, b=0) + call("nope"), '{"name": "add", "parameters": {}}', "?"],
        ]
    )
    good, bad = run(calculator, records, policy, max_turns=4)
    assert [m["role"] for m in good.messages] == ["user", "assistant", "tool", "assistant"]
    assert good.messages[2] == {
        "role": "tool",
        "tool_call_id": "call_1_0",
        "name": "add",
        "content": "5.0",
    }
    assert (good.rewards, good.reward, good.errors) == ([1.0], 1.0, [])
    assert (good.turns, good.tool_calls, good.tool_errors, good.truncated) == (2, 1, 0, False)
    tool_outputs = [m["content"] for m in bad.messages if m["role"] == "tool"]
    assert tool_outputs[0] == "error: ZeroDivisionError: division by zero"  # the tool raised
    assert "unknown tool 'nope'" in tool_outputs[1]
    assert "missing 'a'" in tool_outputs[2]  # a Llama 3 call with wrong arguments
    assert (bad.turns, bad.tool_calls, bad.tool_errors, bad.rewards) == (3, 3, 3, [0.0])


def test_say_it_again_two_turns_rewards_add_up():
    records = [{"word": "cat"}, {"word": "dog"}, {"word": "owl"}]
    policy = ScriptedPolicy([["cat", "cat"], ["dog", "cow"], ["owl"]])
    with env(SAY_IT_AGAIN) as e:
        first, second, third = run(e, records, policy, max_turns=4)
    assert [m["content"] for m in first.messages] == ["Say cat.", "cat", "Say it again.", "cat"]
    assert (first.rewards, first.reward, first.turns) == ([0.5, 0.5], 1.0, 2)
    assert (second.rewards, second.reward) == ([0.5, 0.0], 0.5)
    # the script ran out of turns: the episode ends there, without an error
    assert (third.turns, third.rewards, third.errors, third.truncated) == (1, [0.5], [], False)


def test_default_reset_uses_the_prompt_string_or_its_messages(calculator):
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]
    records = [{"prompt": system, "answer": "2"}, {"prompt": 3}, "not a record"]
    firsts = calculator.reset(records)
    assert firsts[0] == system
    assert isinstance(firsts[1], ValueError) and isinstance(firsts[2], ValueError)
    ok, no_prompt, junk = run(calculator, records, ScriptedPolicy([["2"], ["x"], ["y"]]), 2)
    assert ok.messages[:2] == system and ok.reward == 1.0
    assert no_prompt.turns == junk.turns == 0 and "prompt" in no_prompt.errors[0]


def test_step_returning_the_wrong_shape_is_an_episode_error():
    src = """
        def step(messages, record):
            kind = record["kind"]
            if kind == "list":
                return [1.0]
            if kind == "nan":
                return {"observation": None, "reward": float("nan"), "done": True}
            if kind == "bool":
                return {"observation": None, "reward": True, "done": True}
            if kind == "extra":
                return {"observation": None, "reward": 1, "done": True, "info": 1}
            if kind == "done":
                return {"observation": None, "reward": 1, "done": 1}
            if kind == "obs":
                return {"observation": 3, "reward": 1, "done": False}
            if kind == "raise":
                raise KeyError("boom")
            return {"reward": 2, "done": True}
    """
    kinds = ["list", "nan", "bool", "extra", "done", "obs", "raise", "ok"]
    with env(src) as e:
        episodes = run(
            e, [{"prompt": "p", "kind": k} for k in kinds], ScriptedPolicy([["a"]] * 8), 3
        )
        assert e.stats.spawns == 1  # bad results are errors of their items, not of the sandbox
    errors = {k: ep.errors for k, ep in zip(kinds, episodes, strict=True)}
    assert "expected a dict" in errors["list"][0]
    assert "expected a finite number" in errors["nan"][0]
    assert "reward is bool" in errors["bool"][0]
    assert "unknown keys ['info']" in errors["extra"][0]
    assert "done is int" in errors["done"][0]
    assert "observation must be a string" in errors["obs"][0]
    assert "KeyError: 'boom'" in errors["raise"][0]
    assert errors["ok"] == [] and episodes[-1].rewards == [2.0]
    assert all(ep.rewards == [] for ep in episodes[:-1])


def test_an_episode_that_never_says_done_is_cut_at_max_turns():
    src = "def step(m, r):\n    return {'observation': 'more', 'reward': 1, 'done': False}\n"
    with env(src) as e:
        [ep] = run(e, [{"prompt": "go"}], ScriptedPolicy([["x"] * 10]), max_turns=3)
        # a tool round counts toward max_turns too
        [tooly] = run(e, [{"prompt": "go"}], ScriptedPolicy([[call("x")] * 10]), max_turns=2)
    assert (ep.turns, ep.rewards, ep.truncated, ep.errors) == (3, [1.0, 1.0, 1.0], True, [])
    assert [m["role"] for m in ep.messages][-1] == "user"  # the last observation stays
    assert (tooly.turns, tooly.tool_calls, tooly.tool_errors, tooly.truncated) == (2, 2, 2, True)


def test_an_observation_past_the_context_truncates_with_an_error():
    src = "def step(m, r):\n    return {'observation': 'y' * 500, 'reward': 1, 'done': False}\n"
    with env(src) as e:
        [ep] = run(e, [{"prompt": "go"}], ScriptedPolicy([["x"] * 5]), max_turns=5, max_chars=600)
    assert ep.truncated and ep.turns == 2 and ep.rewards == [1.0, 1.0]
    assert len(ep.messages) == 4  # user, assistant, the first observation, assistant
    assert "past the context's 600" in ep.errors[0]


def test_a_hanging_step_hits_the_deadline_and_the_others_still_finish():
    src = """
        def step(messages, record):
            while record["hang"]:
                pass
            return {"observation": None, "reward": 1, "done": True}
    """
    records = [{"prompt": "p", "hang": h} for h in (False, True, False)]
    with env(src, timeout_s=1.0) as e:
        started = time.monotonic()
        episodes = run(e, records, ScriptedPolicy([["a"]] * 3), max_turns=2)
        elapsed = time.monotonic() - started
        assert e.stats.timeouts == 1 and e.stats.spawns == 2  # killed, and a fresh one
        again = run(e, records[:1], ScriptedPolicy([["a"]]), max_turns=2)
    assert elapsed < 30  # one deadline, not one per episode
    assert episodes[1].errors == ["step failed: timeout after 1s"]
    assert episodes[0].rewards == episodes[2].rewards == [1.0]
    assert again[0].rewards == [1.0]


def test_the_sandbox_keeps_the_network_and_host_files_out_of_reach():
    src = """
        import socket
        def reach(kind):
            try:
                if kind == "net":
                    socket.create_connection(("127.0.0.1", 5432), timeout=0.2).close()
                else:
                    open(kind).read()
                return "reached"
            except OSError as exc:
                return type(exc).__name__
        def step(messages, record):
            return {"observation": reach(record["target"]), "reward": 0, "done": False}
    """
    targets = ["net", "/etc/shadow", "/etc/passwd"]
    with env(src) as e:
        episodes = run(
            e, [{"prompt": "p", "target": t} for t in targets], ScriptedPolicy([["a"]] * 3), 1
        )
    seen = [ep.messages[-1]["content"] for ep in episodes]
    assert "reached" not in seen and all(ep.errors == [] for ep in episodes)
    assert seen[0] == "PermissionError"  # seccomp: no sockets
    assert seen[1:] == ["FileNotFoundError", "FileNotFoundError"]  # no /etc in the sandbox


def test_a_source_that_fails_to_load_errors_every_episode():
    with env("import not_a_module_anywhere\n" + SAY_IT_AGAIN) as e:
        episodes = run(e, [{"word": "a"}, {"word": "b"}], ScriptedPolicy([["a"], ["b"]]), 2)
        assert e.stats.spawns == 1  # a load error is not retried item by item
    assert all("failed to load: ModuleNotFoundError" in ep.errors[0] for ep in episodes)
