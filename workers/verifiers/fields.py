"""The record fields a stored verifier cannot score without, read from its config alone.

A verifier that reads a field the records lack errors on every completion; the API compares
these fields with a dataset's at submission and refuses such a job with a 422 instead. The
built-in kinds name theirs in `config.field`; a python verifier's are inferred from its source
with `ast`, never by running it: the parameters of `verify(prompt, completion, ...)` after the
first two that have no default, and, when it takes `**kw`, the constant keys it subscripts
`kw["x"]` outside a guard (`"x" in kw`, `kw.get("x")`, a `try` that catches the KeyError).
The inference only ever names fields a call would fail without: when in doubt it names none.
Graders and judges (templates) and `grade(sample, item)` sources are not inferred.
"""

from __future__ import annotations

import ast
from typing import Any

from .composite import MAX_DEPTH, Resolver
from .python_source import parse_source

# Built-in kinds whose config names the record field they compare the completion with.
_FIELD_KINDS = ("exact_match", "numeric", "regex", "json_schema")
# Exceptions whose handler makes a subscript inside its `try` a guarded (optional) read.
_CATCHES_KEY_ERROR = {"KeyError", "LookupError", "Exception", "BaseException"}


def needed_fields(kind: str, config: dict[str, Any], resolve: Resolver) -> set[str]:
    """The record fields this stored verifier (a composite: any of its parts) errors without.
    A part that no longer resolves names none: opening it reports that."""
    return _needed(kind, config, resolve, 0)


def _needed(kind: str, config: dict[str, Any], resolve: Resolver, depth: int) -> set[str]:
    if kind in _FIELD_KINDS:
        field = config.get("field", "answer" if kind in ("exact_match", "numeric") else None)
        return {field} if isinstance(field, str) else set()
    if kind == "python" and isinstance(config.get("source"), str):
        return python_fields(config["source"])
    if kind != "composite" or depth > MAX_DEPTH:  # stored composites were bounded at registration
        return set()
    found: set[str] = set()
    for part in config.get("parts", []):
        try:
            _, part_kind, part_config = resolve(part["name"], part.get("version"))
        except LookupError:
            continue
        found |= _needed(part_kind, part_config, resolve, depth + 1)
    return found


def python_fields(source: str) -> set[str]:
    """The fields `verify(prompt, completion, ...)` in `source` requires (module docstring)."""
    try:
        tree = parse_source(source)
    except ValueError:
        return set()
    verify = None
    for node in tree.body:  # the last top-level definition is the one bound
        if isinstance(node, ast.FunctionDef) and node.name == "verify":
            verify = node
    if verify is None:
        return set()
    args = verify.args
    positional = [*args.posonlyargs, *args.args]
    first_default = len(positional) - len(args.defaults)
    needed = {a.arg for i, a in enumerate(positional) if i >= 2 and i < first_default}
    needed |= {a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None}
    if args.kwarg is not None:
        needed |= _subscripted_keys(verify, args.kwarg.arg)
    return needed


def _subscripted_keys(function: ast.FunctionDef, name: str) -> set[str]:
    """Constant string keys read as `name["x"]` in `function`, less the guarded ones; none
    when `name` is rebound (then it may not hold the fields any more)."""
    read: set[str] = set()
    guarded: set[str] = set()
    for node in ast.walk(function):
        if node is not function and _rebinds(node, name):
            return set()
        if isinstance(node, ast.Subscript) and _is_name(node.value, name):
            key = _constant_str(node.slice)
            if key is not None and isinstance(node.ctx, ast.Load):
                read.add(key)
        elif isinstance(node, ast.Compare) and any(_is_name(c, name) for c in node.comparators):
            key = _constant_str(node.left)  # "x" in kw, "x" not in kw
            if key is not None:
                guarded.add(key)
        elif isinstance(node, ast.Call) and _is_method_of(node.func, name) and node.args:
            key = _constant_str(node.args[0])  # kw.get("x"), kw.pop("x", ...), ...
            if key is not None:
                guarded.add(key)
        elif isinstance(node, ast.Try | ast.TryStar) and _catches_key_error(node):
            guarded |= _keys_in(node.body, name)
    return read - guarded


def _rebinds(node: ast.AST, name: str) -> bool:
    """`name` assigned, or a parameter of a function nested in verify (which shadows it)."""
    if isinstance(node, ast.Name):
        return node.id == name and isinstance(node.ctx, ast.Store)
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        return False
    a = node.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
    return any(p.arg == name for p in params)


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _is_method_of(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Attribute) and _is_name(node.value, name)


def _constant_str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _catches_key_error(node: ast.Try | ast.TryStar) -> bool:
    for handler in node.handlers:
        if handler.type is None:
            return True
        caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if any(isinstance(c, ast.Name) and c.id in _CATCHES_KEY_ERROR for c in caught):
            return True
    return False


def _keys_in(body: list[ast.stmt], name: str) -> set[str]:
    return {
        key
        for stmt in body
        for node in ast.walk(stmt)
        if isinstance(node, ast.Subscript) and _is_name(node.value, name)
        if (key := _constant_str(node.slice)) is not None
    }
