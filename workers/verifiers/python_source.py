"""Static checks of python-verifier sources: compile and inspect with `ast`, never execute."""

from __future__ import annotations

import ast

MAX_SOURCE_BYTES = 256 * 1024
ENTRY_POINTS = ("verify", "grade")


def _syntax_error_text(exc: SyntaxError) -> str:
    msg = exc.msg or str(exc)
    if exc.lineno:
        return f"{type(exc).__name__}: {msg} (line {exc.lineno})"
    return f"{type(exc).__name__}: {msg}"


def _top_level_names(body: list[ast.stmt]) -> dict[str, str]:
    """Names bound at module level -> how ('def', 'async def', 'class', 'assign', 'import').

    Descends into module-level if/try/with blocks (still module scope), not into functions.
    """
    found: dict[str, str] = {}

    def bind(name: str, how: str) -> None:
        found.setdefault(name, how)

    def target_names(t: ast.expr) -> list[str]:
        if isinstance(t, ast.Name):
            return [t.id]
        if isinstance(t, ast.Tuple | ast.List):
            return [n for e in t.elts for n in target_names(e)]
        if isinstance(t, ast.Starred):
            return target_names(t.value)
        return []

    def walk(stmts: list[ast.stmt]) -> None:
        for s in stmts:
            if isinstance(s, ast.FunctionDef):
                bind(s.name, "def")
            elif isinstance(s, ast.AsyncFunctionDef):
                bind(s.name, "async def")
            elif isinstance(s, ast.ClassDef):
                bind(s.name, "class")
            elif isinstance(s, ast.Assign):
                for t in s.targets:
                    for n in target_names(t):
                        bind(n, "assign")
            elif isinstance(s, ast.AnnAssign | ast.AugAssign) and s.value is not None:
                for n in target_names(s.target):
                    bind(n, "assign")
            elif isinstance(s, ast.Import | ast.ImportFrom):
                for alias in s.names:
                    bind((alias.asname or alias.name).split(".")[0], "import")
            elif isinstance(s, ast.If | ast.While | ast.For):
                walk(s.body)
                walk(s.orelse)
            elif isinstance(s, ast.With):
                walk(s.body)
            elif isinstance(s, ast.Try | ast.TryStar):
                walk(s.body)
                for h in s.handlers:
                    walk(h.body)
                walk(s.orelse)
                walk(s.finalbody)

    walk(body)
    return found


def parse_source(source: str, filename: str = "<verifier>") -> ast.Module:
    """Size-check and compile `source` without running it; its syntax tree.

    Raises ValueError with a user-facing message (shared by python verifiers and environments).
    """
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > MAX_SOURCE_BYTES:
        raise ValueError(f"source is {size} bytes; the limit is {MAX_SOURCE_BYTES} (256 kB)")
    try:
        tree = ast.parse(source, filename=filename, mode="exec")
        compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise ValueError(_syntax_error_text(exc)) from None
    except (ValueError, TypeError) as exc:  # e.g. null bytes
        raise ValueError(f"source does not compile: {exc}") from None
    except (RecursionError, MemoryError):
        raise ValueError("source does not compile: too deeply nested") from None
    return tree


def top_level_names(tree: ast.Module) -> dict[str, str]:
    """Names bound at module level -> how ('def', 'async def', 'class', 'assign', 'import')."""
    return _top_level_names(tree.body)


def analyse_python_source(source: str) -> str:
    """Compile `source` (without running it) and return its entry point: 'verify' or 'grade'.

    Raises ValueError with a user-facing message.
    """
    names = _top_level_names(parse_source(source).body)
    for entry in ENTRY_POINTS:
        how = names.get(entry)
        if how == "async def":
            raise ValueError(f"`{entry}` must be a plain function; `async def` is not supported")
        if how is not None:
            return entry
    raise ValueError(
        "source must define a top-level function `verify(prompt, completion, **fields)` "
        "(or an OpenAI-style `grade(sample, item)`)"
    )
