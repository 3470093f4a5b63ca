"""Tool calls: parsing them out of an assistant turn, and checking them against the tools.

The tools' schemas (OpenAI function tools) are computed inside the sandbox from the source's
type hints and docstrings (`_runtime.py`) and handed out by the host; here they are only read.
Formats understood, the two families' chat templates emit them:
  Hermes / Qwen:  <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>
                  (several per turn; an unclosed last tag runs to the end of the turn)
  Llama 3 JSON:   {"name": "add", "parameters": {"a": 1, "b": 2}}  (the whole turn, optionally
                  after <|python_tag|>)
A call that cannot be used (malformed JSON, unknown tool, wrong arguments) comes back as a
ToolCall with `error` set: its error text becomes the tool message, the episode goes on.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .protocol import ToolCall

HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
PYTHON_TAG = "<|python_tag|>"
MAX_CALLS_PER_TURN = 16
_JSON_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def tool_functions(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """name -> the `function` part of each OpenAI function tool."""
    return {t["function"]["name"]: t["function"] for t in tools if t.get("type") == "function"}


def parse_tool_calls(
    text: str, tools: list[dict[str, Any]], *, call_id: str = "call"
) -> list[ToolCall]:
    """The tool calls in one assistant turn, in order; [] when the turn calls none.

    Ids are `{call_id}_{k}`, deterministic so that a replayed episode is identical.
    """
    bodies = [m.group(1) for m in HERMES.finditer(text)]
    key = "arguments"
    if not bodies:
        stripped = text.strip()
        tagged = stripped.startswith(PYTHON_TAG)
        stripped = stripped.removeprefix(PYTHON_TAG).strip()
        if not (tagged or (tools and _looks_like_llama_call(stripped))):
            return []
        bodies, key = [stripped], "parameters"
    functions = tool_functions(tools)
    calls = [
        _parse_one(body, functions, key, f"{call_id}_{k}")
        for k, body in enumerate(bodies[:MAX_CALLS_PER_TURN])
    ]
    for k in range(MAX_CALLS_PER_TURN, len(bodies)):
        error = f"more than {MAX_CALLS_PER_TURN} tool calls in one turn; this one was not run"
        calls.append(ToolCall(name="", arguments={}, id=f"{call_id}_{k}", error=error))
    return calls


def _looks_like_llama_call(text: str) -> bool:
    """A bare JSON object with a "name" and its "parameters": a Llama 3 call; other JSON
    (an answer that happens to be JSON) is not."""
    if not text.startswith("{"):
        return False
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    return isinstance(obj, dict) and "name" in obj and ("parameters" in obj or "arguments" in obj)


def _parse_one(body: str, functions: dict[str, dict[str, Any]], key: str, call_id: str) -> ToolCall:
    def failed(error: str, name: str = "") -> ToolCall:
        return ToolCall(name=name, arguments={}, id=call_id, error=error)

    try:
        obj = json.loads(body.strip())
    except (ValueError, RecursionError) as exc:
        return failed(f"error: the tool call is not valid JSON ({exc})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return failed('error: a tool call must be a JSON object {"name": ..., "' + key + '": {}}')
    name = obj["name"]
    arguments = obj.get(key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(arguments, str):  # OpenAI style: the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return failed(f"error: the arguments of {name!r} are not valid JSON", name)
    if not isinstance(arguments, dict):
        return failed(f"error: the arguments of {name!r} must be a JSON object", name)
    function = functions.get(name)
    if function is None:
        known = ", ".join(sorted(functions)) or "none"
        return failed(f"error: unknown tool {name!r} (tools: {known})", name)
    problem = check_arguments(arguments, function.get("parameters") or {})
    if problem is not None:
        return failed(f"error: wrong arguments for {name!r}: {problem}", name)
    return ToolCall(name=name, arguments=arguments, id=call_id)


def check_arguments(arguments: dict[str, Any], schema: dict[str, Any]) -> str | None:
    """What is wrong with `arguments` against a tool's parameters schema, or None."""
    properties = schema.get("properties") or {}
    missing = [p for p in schema.get("required") or () if p not in arguments]
    if missing:
        return f"missing {', '.join(map(repr, missing))}"
    unknown = [a for a in arguments if a not in properties]
    if unknown:
        return f"unexpected {', '.join(map(repr, unknown))}"
    for name, value in arguments.items():
        if not _matches(value, properties[name]):
            return f"{name!r} must be {_describe(properties[name])}, not {json.dumps(value)}"
    return None


def _matches(value: Any, schema: dict[str, Any]) -> bool:
    if "enum" in schema:
        return value in schema["enum"]
    if "anyOf" in schema:
        return any(_matches(value, option) for option in schema["anyOf"])
    types = schema.get("type")
    if types is None:
        return True
    types = [types] if isinstance(types, str) else types
    if not any(_JSON_CHECKS.get(t, lambda v: False)(value) for t in types):
        return False
    if isinstance(value, list) and "items" in schema:
        return all(_matches(v, schema["items"]) for v in value)
    if isinstance(value, dict) and "additionalProperties" in schema:
        return all(_matches(v, schema["additionalProperties"]) for v in value.values())
    return True


def _describe(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(_describe(o) for o in schema["anyOf"])
    types = schema.get("type", "any value")
    return " or ".join(types) if isinstance(types, list) else str(types)
