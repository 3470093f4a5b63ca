"""`calculate_output` of a multi grader: a tiny arithmetic language, never `eval`.

The expression is parsed with `ast` and checked against a whitelist when the grader is created:
numbers, the names of the multi grader's sub-graders, `+ - * / **`, unary minus and plus,
parentheses, and calls of min/max/abs/floor/ceil/sqrt/log/exp. Anything else (attributes,
subscripts, comparisons, other names or calls, keywords) is refused then. Evaluation walks the
same tree over floats, so no big-integer power can run away (`10 ** 10 ** 10` overflows
at once); a domain error (`log(0)`, division by zero, a complex root) is an error for that item.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Iterable

MAX_EXPRESSION_CHARS = 1000

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
# name -> (function, fewest arguments, most arguments)
FUNCTIONS: dict[str, tuple[Callable[..., float], int, int]] = {
    "min": (min, 2, 64),
    "max": (max, 2, 64),
    "abs": (abs, 1, 1),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "sqrt": (math.sqrt, 1, 1),
    "log": (math.log, 1, 1),
    "exp": (math.exp, 1, 1),
}


class ExpressionError(ValueError):
    """The expression uses something outside the whitelist (or does not parse)."""


def _check(node: ast.AST, names: frozenset[str]) -> None:
    if isinstance(node, ast.Expression):
        _check(node.body, names)
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        _check(node.left, names)
        _check(node.right, names)
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        _check(node.operand, names)
    elif isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ExpressionError(f"{node.value!r} is not a number")
    elif isinstance(node, ast.Name):
        if node.id not in names:
            known = ", ".join(sorted(names)) or "none"
            raise ExpressionError(f"{node.id!r} is not one of the graders ({known})")
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            allowed = ", ".join(FUNCTIONS)
            raise ExpressionError(f"only these functions can be called: {allowed}")
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise ExpressionError(f"{node.func.id}() takes plain arguments only")
        _, fewest, most = FUNCTIONS[node.func.id]
        if not fewest <= len(node.args) <= most:
            count = str(fewest) if fewest == most else f"{fewest} to {most}"
            raise ExpressionError(f"{node.func.id}() takes {count} arguments")
        for arg in node.args:
            _check(arg, names)
    else:
        shown = type(node).__name__
        if isinstance(node, ast.BinOp | ast.UnaryOp):
            shown = type(node.op).__name__
        raise ExpressionError(f"{shown} is not allowed: use numbers, grader names, + - * / **")


def parse_expression(text: str, names: Iterable[str]) -> ast.Expression:
    """The checked tree of `text`, whose names must be among `names`."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression is {len(text)} characters; at most 1000")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"expression does not parse: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError):
        raise ExpressionError("expression does not parse: too deeply nested") from None
    try:
        _check(tree, frozenset(names) - FUNCTIONS.keys())
    except RecursionError:
        raise ExpressionError("expression is too deeply nested") from None
    return tree


def _value(node: ast.AST, values: dict[str, float]) -> float:
    if isinstance(node, ast.Expression):
        return _value(node.body, values)
    if isinstance(node, ast.BinOp):
        result = _BINARY[type(node.op)](_value(node.left, values), _value(node.right, values))
        if isinstance(result, complex):  # (-8.0) ** (1 / 3)
            raise ValueError("the result is not a real number")
        return result
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_value(node.operand, values))
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):  # `_check`ed
        return float(node.value)
    if isinstance(node, ast.Name):
        return values[node.id]
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    fn = FUNCTIONS[node.func.id][0]
    return float(fn(*(_value(a, values) for a in node.args)))


def evaluate(tree: ast.Expression, values: dict[str, float]) -> float:
    """The expression's value over floats; ArithmeticError/ValueError on a domain error or a
    result that is not finite."""
    result = _value(tree, {k: float(v) for k, v in values.items()})
    if not math.isfinite(result):
        raise ValueError(f"the result is {result}, not a finite number")
    return result
