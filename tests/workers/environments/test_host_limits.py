"""The length of an environment's texts is checked again on the host (issue 34 item 11): the
sandbox's runtime checks the tenant's own objects, and a `str` subclass whose `__len__` answers
0 passes it, while JSON carries all its characters out. A real bubblewrap sandbox."""

from __future__ import annotations

import textwrap

from workers.environments import EnvironmentConfig, SandboxedEnvironment, _runtime
from workers.environments.host import MAX_TEXT
from workers.environments.protocol import ToolCall, ToolError

LYING = f"""
class Short(str):
    def __len__(self):
        return 0

LONG = Short("x" * {MAX_TEXT + 1})

def shout() -> str:
    \"\"\"A long output.\"\"\"
    return LONG

tools = [shout]

def reset(record):
    return LONG if record.get("long") else "hi"

def step(messages, record):
    text = LONG if record.get("long") else "ok"
    return {{"observation": text, "reward": 0.0, "done": False}}
"""

LIMIT = f"is {MAX_TEXT + 1} characters; the limit is {MAX_TEXT}"


def test_the_host_limit_is_the_runtimes() -> None:
    assert MAX_TEXT == _runtime.MAX_TEXT


def test_a_str_subclass_lying_about_its_length_is_refused_on_the_host() -> None:
    config = EnvironmentConfig(source=textwrap.dedent(LYING))
    with SandboxedEnvironment(config) as env:
        long, short = env.step([([], {"long": True}), ([], {})])
        assert long.error == f"step failed: step's observation {LIMIT}"
        assert long.observation is None
        assert short.error is None and short.observation == "ok"

        refused, first = env.reset([{"long": True}, {}])
        assert isinstance(refused, ValueError)
        assert str(refused) == f"reset failed: reset's result {LIMIT}"
        assert first == "hi"

        (output,) = env.call_tools([ToolCall(name="shout", arguments={})])
        assert isinstance(output, ToolError) and output == f"error: the tool's output {LIMIT}"
