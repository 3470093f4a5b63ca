"""An environment's config and the static checks of its source, done at registration.

The source is only parsed and inspected with `ast`, never executed in the caller's process (the
API validates with this). What it must define:
  step(messages, record) -> {"observation": str | None, "reward": float, "done": bool}
  reset(record) -> str                         optional; default: the record's prompt
  tools = [fn, ...]                            optional; each a plain `def` with a docstring
                                               and a type hint on every parameter
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator

from workers.verifiers.python_source import MAX_SOURCE_BYTES, parse_source, top_level_names

MAX_TOOLS = 64
# Annotation names a tool parameter may use: JSON types and their typing spellings.
TYPE_NAMES = frozenset(
    {"str", "int", "float", "bool", "list", "dict", "None", "Optional", "Union", "Literal"}
    | {"List", "Dict", "Any"}
)


class EnvironmentConfig(BaseModel):
    """What `POST /v1/environments` stores as `config` (kind `python`)."""

    model_config = ConfigDict(extra="forbid")

    source: Annotated[str, Strict(), Field(max_length=MAX_SOURCE_BYTES)]
    timeout_s: Annotated[float, Strict(), Field(gt=0, le=300)] = 10.0

    @field_validator("source")
    @classmethod
    def _check_source(cls, v: str) -> str:
        check_source(v)  # a ValueError: pydantic reports it on `source`
        return v


@dataclass(frozen=True)
class SourceInfo:
    """What the static check learned: whether `reset` is defined, and the tools' names."""

    has_reset: bool
    tools: tuple[str, ...]


def check_source(source: str) -> SourceInfo:
    """Compile `source` (without running it) and check the environment contract.

    Raises ValueError with a message naming the problem (the API answers it as a 422).
    """
    tree = parse_source(source, "<environment>")
    names = top_level_names(tree)
    defs = {s.name: s for s in tree.body if isinstance(s, ast.FunctionDef)}
    if "step" not in names:
        raise ValueError(
            "source must define a top-level function `step(messages, record)` returning "
            '{"observation": str | None, "reward": float, "done": bool}'
        )
    _check_function("step", names, defs, 2, "step(messages, record)")
    has_reset = "reset" in names
    if has_reset:
        _check_function("reset", names, defs, 1, "reset(record)")
    tools = _check_tools(tree, names, defs) if "tools" in names else ()
    return SourceInfo(has_reset=has_reset, tools=tools)


def _check_function(
    name: str, names: dict[str, str], defs: dict[str, ast.FunctionDef], arity: int, shape: str
) -> None:
    how = names[name]
    if how != "def":
        raise ValueError(f"`{name}` must be a plain function `def {shape}`, not {how!r}")
    fn = defs.get(name)
    if fn is None:  # defined inside a module-level if/try: its arity is checked when it loads
        return
    a = fn.args
    positional = len(a.posonlyargs) + len(a.args)
    required = positional - len(a.defaults)
    required_kw = [k.arg for k, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is None]
    if required > arity or (positional < arity and a.vararg is None) or required_kw:
        raise ValueError(
            f"`{name}` takes {positional} positional argument(s); it is called as `{shape}` "
            f"with {arity}"
        )


def _check_tools(
    tree: ast.Module, names: dict[str, str], defs: dict[str, ast.FunctionDef]
) -> tuple[str, ...]:
    assigned = [
        s.value
        for s in tree.body
        if isinstance(s, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "tools" for t in s.targets)
    ]
    if len(assigned) != 1 or not isinstance(assigned[0], ast.List | ast.Tuple):
        raise ValueError("`tools` must be assigned once, at top level, a list of functions")
    found: list[str] = []
    for element in assigned[0].elts:
        if not isinstance(element, ast.Name):
            raise ValueError(
                f"`tools` lists {ast.unparse(element)!r}: list functions by name, "
                "`tools = [add, multiply]`"
            )
        tool = element.id
        if names.get(tool) != "def" or tool not in defs:
            raise ValueError(f"tool `{tool}` must be a plain top-level function (`def {tool}`)")
        if tool in found:
            raise ValueError(f"tool `{tool}` is listed twice")
        _check_tool(defs[tool])
        found.append(tool)
    if len(found) > MAX_TOOLS:
        raise ValueError(f"{len(found)} tools; the limit is {MAX_TOOLS}")
    return tuple(found)


def _check_tool(fn: ast.FunctionDef) -> None:
    if ast.get_docstring(fn) is None:
        raise ValueError(f"tool `{fn.name}` needs a docstring (it is the tool's description)")
    a = fn.args
    if a.vararg is not None or a.kwarg is not None:
        raise ValueError(f"tool `{fn.name}` may not take *args or **kwargs")
    for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
        if arg.annotation is None:
            raise ValueError(
                f"tool `{fn.name}`: parameter `{arg.arg}` needs a type hint "
                "(str, int, float, bool, list, dict, Optional[...], Literal[...])"
            )
        bad = _unsupported_type(arg.annotation)
        if bad is not None:
            raise ValueError(
                f"tool `{fn.name}`: parameter `{arg.arg}` has type {bad!r}; use str, int, "
                "float, bool, list, dict, Optional[...] or Literal[...]"
            )


def _unsupported_type(node: ast.expr) -> str | None:
    """The first part of an annotation that is not a JSON type, or None."""
    if isinstance(node, ast.Constant):
        if node.value is None or isinstance(node.value, str | int | bool):
            return None  # None, Literal values, a string annotation's parts are checked below
        return repr(node.value)
    if isinstance(node, ast.Name):
        return None if node.id in TYPE_NAMES else node.id
    if isinstance(node, ast.Attribute):  # typing.Optional
        ok = isinstance(node.value, ast.Name) and node.value.id == "typing"
        return None if ok and node.attr in TYPE_NAMES else ast.unparse(node)
    if isinstance(node, ast.Subscript):
        return _unsupported_type(node.value) or _unsupported_type(node.slice)
    if isinstance(node, ast.Tuple):
        return next((b for e in node.elts if (b := _unsupported_type(e)) is not None), None)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _unsupported_type(node.left) or _unsupported_type(node.right)
    return ast.unparse(node)
