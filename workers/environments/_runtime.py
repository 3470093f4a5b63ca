"""The environment protocol inside the sandbox: standard library only, never imported by us.

`host.py` sends this file's text as the `runtime` of the verifier bootstrap
(workers/verifiers/_bootstrap.py); after the tenant's source has run, the bootstrap calls
`make_caller(module)` and feeds it each item of a batch:
  {"op": "tools"}                                -> [OpenAI function tool, ...]
  {"op": "reset", "record": {...}}               -> str | [message, ...]
  {"op": "step", "messages": [...], "record": {...}}
                                                 -> {"observation", "reward", "done"}
  {"op": "tool", "name": str, "arguments": {...}} -> {"output": str, "error": bool}
An exception becomes the item's error (the bootstrap's "e" result); a tool that raises is not an
error of the item: its text is the tool's output. The host checks every result again.
"""

import inspect
import json
import math
import numbers
import typing

MAX_TEXT = 1_000_000  # characters of one observation or tool output (a result frame is 8 MiB)
STEP_KEYS = ("observation", "reward", "done")
JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def make_caller(module):
    env = vars(module)
    step, reset = env["step"], env.get("reset")
    tools = {fn.__name__: fn for fn in env.get("tools") or ()}

    def call(item):
        op = item.get("op")
        if op == "step":
            return _step(step, item["messages"], item["record"])
        if op == "reset":
            if reset is None:
                raise TypeError("the source defines no `reset`")
            return _first_turn(reset(item["record"]))
        if op == "tool":
            return _tool(tools, item["name"], item["arguments"])
        if op == "tools":
            return [_tool_schema(fn) for fn in tools.values()]
        raise ValueError(f"unknown request {op!r}")

    return call


def _text(value, what):
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, not {type(value).__name__}")
    if len(value) > MAX_TEXT:
        raise ValueError(f"{what} is {len(value)} characters; the limit is {MAX_TEXT}")
    return value


def _first_turn(value):
    if isinstance(value, str):
        return _text(value, "reset's result")
    raise TypeError(f"reset returned {type(value).__name__}; expected the first user turn (str)")


def _step(step, messages, record):
    value = step(messages, record)
    if not isinstance(value, dict):
        raise TypeError(
            f"step returned {type(value).__name__}; expected a dict "
            '{"observation": str | None, "reward": float, "done": bool}'
        )
    extra = sorted(str(k) for k in value if k not in STEP_KEYS)
    if extra:
        raise ValueError(f"step returned unknown keys {extra}; expected {list(STEP_KEYS)}")
    missing = [k for k in ("reward", "done") if k not in value]
    if missing:
        raise ValueError(f"step's result has no {' or '.join(map(repr, missing))}")
    observation, reward, done = value.get("observation"), value["reward"], value["done"]
    if observation is not None:
        observation = _text(observation, "step's observation")
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
        raise TypeError(f"step's reward is {type(reward).__name__}; expected a finite number")
    reward = float(reward)
    if not math.isfinite(reward):
        raise ValueError(f"step's reward is {reward}; expected a finite number")
    if not isinstance(done, bool):
        raise TypeError(f"step's done is {type(done).__name__}; expected true or false")
    return {"observation": observation, "reward": reward, "done": done}


def _tool(tools, name, arguments):
    fn = tools.get(name)
    if fn is None:
        return {"output": f"error: unknown tool {name!r}", "error": True}
    try:
        out = fn(**arguments)
        if not isinstance(out, str):
            out = json.dumps(out, default=str)
        return {"output": _text(out, "the tool's output"), "error": False}
    except Exception as exc:
        try:
            text = f"{type(exc).__name__}: {exc}"
        except Exception:  # a broken __str__
            text = type(exc).__name__
        return {"output": f"error: {text}"[:2000], "error": True}


def _describe(doc):
    """(description, {parameter: description}) from a docstring with an optional
    Google-style `Args:` section."""
    lines = inspect.cleandoc(doc or "").splitlines()
    head, params, current = [], {}, None
    in_args = False
    for line in lines:
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args:
            if stripped.endswith(":") and not line.startswith(" "):  # Returns:, Raises:
                in_args = False
                continue
            name, sep, text = stripped.partition(":")
            name = name.split("(")[0].strip()
            if sep and name.isidentifier() and len(line) - len(line.lstrip()) == 4:
                params[name], current = text.strip(), name
            elif current and stripped:
                params[current] += " " + stripped
            continue
        head.append(line)
    return "\n".join(head).strip(), params


def _tool_schema(fn):
    description, described = _describe(fn.__doc__)
    hints = typing.get_type_hints(fn)
    properties, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        schema = _json_schema(hints[p.name], f"{fn.__name__}({p.name})")
        if p.name in described:
            schema["description"] = described[p.name]
        properties[p.name] = schema
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    parameters = {"type": "object", "properties": properties, "required": required}
    function = {"name": fn.__name__, "description": description, "parameters": parameters}
    return {"type": "function", "function": function}


def _json_schema(hint, where):
    if hint in JSON_TYPES:
        return {"type": JSON_TYPES[hint]}
    if hint is type(None):
        return {"type": "null"}
    if hint is typing.Any:
        return {}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is list or origin is list:
        return {"type": "array", **({"items": _json_schema(args[0], where)} if args else {})}
    if hint is dict or origin is dict:
        extra = {"additionalProperties": _json_schema(args[1], where)} if len(args) == 2 else {}
        return {"type": "object", **extra}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin is typing.Union or type(hint).__name__ == "UnionType":
        options = [_json_schema(a, where) for a in args]
        types = [o.get("type") for o in options]
        if all(isinstance(t, str) and len(o) == 1 for t, o in zip(types, options, strict=True)):
            return {"type": types}
        return {"anyOf": options}
    raise TypeError(f"{where}: type {hint!r} has no JSON schema")
