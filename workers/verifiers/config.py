"""Verifier kinds, their configs, and validation at registration.

Validation never executes user code: python sources are only compiled and inspected with `ast`.
This module is imported by the API process, so it must stay free of torch, FastAPI and Celery.
"""

from __future__ import annotations

import ast
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator
from pydantic_core import PydanticCustomError

KINDS: tuple[str, ...] = ("python", "exact_match", "regex", "numeric", "length")

MAX_SOURCE_BYTES = 256 * 1024
MAX_PATTERN_CHARS = 10_000

ErrorPath = tuple[str | int, ...]

SFloat = Annotated[float, Strict(), Field(allow_inf_nan=False)]
SInt = Annotated[int, Strict()]
SStr = Annotated[str, Strict()]
SBool = Annotated[bool, Strict()]
FieldName = Annotated[str, Strict(), Field(min_length=1, max_length=200)]


class VerifierConfigError(ValueError):
    """A verifier config is invalid; `errors` lists every bad field as (path, message)."""

    def __init__(self, errors: list[tuple[ErrorPath, str]]):
        self.errors: list[tuple[ErrorPath, str]] = list(errors)
        text = "; ".join(f"{'.'.join(map(str, p)) or '<config>'}: {m}" for p, m in self.errors)
        super().__init__(f"invalid verifier config: {text}")


# ----------------------------------------------------------------------------- python sources

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


def analyse_python_source(source: str) -> str:
    """Compile `source` (without running it) and return its entry point: 'verify' or 'grade'.

    Raises ValueError with a user-facing message.
    """
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > MAX_SOURCE_BYTES:
        raise ValueError(f"source is {size} bytes; the limit is {MAX_SOURCE_BYTES} (256 kB)")
    try:
        tree = ast.parse(source, filename="<verifier>", mode="exec")
        compile(source, "<verifier>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise ValueError(_syntax_error_text(exc)) from None
    except (ValueError, TypeError) as exc:  # e.g. null bytes
        raise ValueError(f"source does not compile: {exc}") from None
    except (RecursionError, MemoryError):
        raise ValueError("source does not compile: too deeply nested") from None
    names = _top_level_names(tree.body)
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


def _custom(kind: str, message: str) -> PydanticCustomError:
    # PydanticCustomError keeps the message verbatim (no "Value error, " prefix).
    return PydanticCustomError(kind, "{m}", {"m": message})


# ----------------------------------------------------------------------------- per-kind models


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PythonConfig(_Config):
    source: SStr
    timeout_s: Annotated[float, Strict(), Field(gt=0, le=300)] = 10.0
    score_range: Annotated[list[SFloat], Field(min_length=2, max_length=2)] = [0.0, 1.0]

    @field_validator("source")
    @classmethod
    def _check_source(cls, v: str) -> str:
        try:
            analyse_python_source(v)
        except ValueError as exc:
            raise _custom("python_source", str(exc)) from None
        return v

    @field_validator("score_range")
    @classmethod
    def _check_range(cls, v: list[float]) -> list[float]:
        if not v[0] < v[1]:
            raise _custom("score_range", "score_range must be [lo, hi] with lo < hi")
        return v


class ExactMatchConfig(_Config):
    field: FieldName = "answer"
    strip: SBool = True
    case_sensitive: SBool = True
    normalize_whitespace: SBool = False


REGEX_FLAGS = {"IGNORECASE": re.IGNORECASE, "MULTILINE": re.MULTILINE, "DOTALL": re.DOTALL}


class RegexConfig(_Config):
    pattern: Annotated[str, Strict(), Field(min_length=1, max_length=MAX_PATTERN_CHARS)]
    mode: Literal["search", "fullmatch"] = "search"
    field: FieldName | None = None
    group: int | str = 0
    flags: list[Literal["IGNORECASE", "MULTILINE", "DOTALL"]] = []

    @field_validator("pattern")
    @classmethod
    def _check_pattern(cls, v: str) -> str:
        if message := _pattern_error(v, 0):
            raise _custom("regex_pattern", message)
        return v

    @field_validator("group", mode="plain")
    @classmethod
    def _check_group(cls, v: Any) -> int | str:
        if (isinstance(v, int) and not isinstance(v, bool) and v >= 0) or isinstance(v, str):
            return v
        raise _custom("group", "group must be a group number (>= 0) or a group name")

    def compiled(self) -> re.Pattern[str]:
        flags = 0
        for name in self.flags:
            flags |= REGEX_FLAGS[name]
        return re.compile(self.pattern, flags)


class NumericConfig(_Config):
    field: FieldName = "answer"
    tolerance: Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)] = 1e-6
    relative: SBool = False


class LengthConfig(_Config):
    target: Annotated[int, Strict(), Field(ge=0)]
    penalty: Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)] = 0.01
    unit: Literal["chars"] = "chars"


MODELS: dict[str, type[_Config]] = {
    "python": PythonConfig,
    "exact_match": ExactMatchConfig,
    "regex": RegexConfig,
    "numeric": NumericConfig,
    "length": LengthConfig,
}


def _pattern_error(pattern: str, flags: int) -> str | None:
    try:
        re.compile(pattern, flags)
    except re.error as exc:
        where = f" at position {exc.pos}" if exc.pos is not None else ""
        return f"re.error: {exc.msg}{where}"
    except (RecursionError, OverflowError, MemoryError) as exc:
        return f"pattern does not compile: {type(exc).__name__}"
    return None


def _regex_errors(cfg: RegexConfig) -> list[tuple[ErrorPath, str]]:
    try:
        pattern = cfg.compiled()
    except Exception:  # only the flags can make a pattern that compiled alone fail now
        message = _pattern_error(cfg.pattern, sum(REGEX_FLAGS[f] for f in cfg.flags))
        return [(("pattern",), message or "pattern does not compile with these flags")]
    g = cfg.group
    if isinstance(g, int) and g > pattern.groups:
        return [(("group",), f"group {g} does not exist; the pattern has {pattern.groups}")]
    if isinstance(g, str) and g not in pattern.groupindex:
        return [(("group",), f"the pattern has no group named {g!r}")]
    return []


def parse_config(kind: str, config: Any) -> _Config:
    """Validate and return the pydantic model for `kind` (raises VerifierConfigError)."""
    if kind not in MODELS:
        raise VerifierConfigError(
            [(("kind",), f"unknown verifier kind {kind!r}; expected one of {', '.join(KINDS)}")]
        )
    if not isinstance(config, dict):
        raise VerifierConfigError([((), f"config must be an object, not {type(config).__name__}")])
    try:
        model = MODELS[kind].model_validate(config)
    except ValidationError as exc:
        errors = [(tuple(e["loc"]), e["msg"]) for e in exc.errors(include_url=False)]
        raise VerifierConfigError(errors) from None
    if isinstance(model, RegexConfig) and (errors := _regex_errors(model)):
        raise VerifierConfigError(errors)
    return model


def validate_config(kind: str, config: dict) -> dict:
    """Validate and normalise a verifier config (fill defaults).

    Raises VerifierConfigError listing every bad field as ((path...), message).
    """
    return parse_config(kind, config).model_dump(mode="json")
