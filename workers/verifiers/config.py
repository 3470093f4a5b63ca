"""Verifier kinds, their configs, and validation at registration.

Validation never executes user code: python sources are only compiled and inspected with `ast`.
This module is imported by the API process, so it must stay free of torch, FastAPI and Celery.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from .grader_config import GraderConfigError, parse_grader
from .judge_config import JudgeConfig, endpoint_errors
from .patterns import PatternError, compile_pattern, schema_depth, schema_patterns
from .python_source import analyse_python_source

KINDS: tuple[str, ...] = (
    "python",
    "exact_match",
    "regex",
    "numeric",
    "json_schema",
    "length",
    "composite",
    "openai_grader",
    "judge",
)

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
    # Per job (or /test call): total wall time in score(), and sandbox failures tolerated
    # (timeouts, crashes, protocol violations) before the job fails. 600 s is ~60 batches
    # at the default per-batch deadline, far above a healthy verifier's needs.
    budget_s: Annotated[float, Strict(), Field(gt=0, le=86_400)] = 600.0
    max_failures: Annotated[int, Strict(), Field(ge=0, le=10_000)] = 10

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


class RegexConfig(_Config):
    """Score 1.0 when the completion matches `pattern` (RE2 syntax: `patterns.py`) and, with
    `field`, the matched `group` equals the record's field; 0.0 otherwise."""

    pattern: Annotated[str, Strict(), Field(min_length=1, max_length=MAX_PATTERN_CHARS)]
    mode: Literal["search", "fullmatch"] = "search"
    field: FieldName | None = None
    group: int | str = 0
    flags: list[Literal["IGNORECASE", "MULTILINE", "DOTALL"]] = []

    @field_validator("pattern")
    @classmethod
    def _check_pattern(cls, v: str) -> str:
        if message := _pattern_error(v, ()):
            raise _custom("regex_pattern", message)
        return v

    @field_validator("group", mode="plain")
    @classmethod
    def _check_group(cls, v: Any) -> int | str:
        if (isinstance(v, int) and not isinstance(v, bool) and v >= 0) or isinstance(v, str):
            return v
        raise _custom("group", "group must be a group number (>= 0) or a group name")

    def compiled(self) -> Any:
        return compile_pattern(self.pattern, self.flags)


class NumericConfig(_Config):
    field: FieldName = "answer"
    tolerance: Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)] = 1e-6
    relative: SBool = False


class LengthConfig(_Config):
    target: Annotated[int, Strict(), Field(ge=0)]
    penalty: Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)] = 0.01
    unit: Literal["chars"] = "chars"


MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 32


class JsonSchemaConfig(_Config):
    """Score 1.0 when the completion is JSON (whole, or the last ```json fence) that validates
    against `schema` and, if `field` is set, equals the record's `field`; 0.0 otherwise."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    json_schema: Any = Field(alias="schema")
    extract: Literal["auto", "whole", "fence"] = "auto"
    field: FieldName | None = None

    @field_validator("json_schema")
    @classmethod
    def _check_schema(cls, v: Any) -> dict[str, Any] | bool:
        import json

        from jsonschema import exceptions, validators

        if not isinstance(v, dict | bool):
            raise _custom("json_schema", "schema must be a JSON object (or true/false)")
        try:
            size = len(json.dumps(v, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise _custom("json_schema", f"schema is not plain JSON: {exc}") from None
        if size > MAX_SCHEMA_BYTES:
            raise _custom("json_schema", f"schema is {size} bytes; the limit is 64 kB")
        if (depth := schema_depth(v)) > MAX_SCHEMA_DEPTH:
            message = f"schema nests {depth} levels deep; the limit is {MAX_SCHEMA_DEPTH}"
            raise _custom("json_schema", message)
        for where, pattern in schema_patterns(v):
            if refusal := _pattern_error(pattern, ()):
                raise _custom("json_schema", f"at {'/'.join(map(str, where))}: {refusal}")
        try:
            validators.validator_for(v).check_schema(v)
        except exceptions.SchemaError as exc:
            at = "/".join(map(str, exc.absolute_path)) or "<root>"
            message = f"not a valid JSON Schema at {at}: {exc.message}"
            raise _custom("json_schema", message) from None
        return v


MAX_COMPOSITE_PARTS = 16


class CompositePart(_Config):
    name: Annotated[str, Strict(), Field(min_length=1, max_length=200)]
    version: Annotated[int, Strict(), Field(ge=1)] | None = None
    weight: SFloat = 1.0


class CompositeConfig(_Config):
    """Σ weight · score over the parts; `version: null` is pinned at registration."""

    parts: Annotated[list[CompositePart], Field(min_length=1, max_length=MAX_COMPOSITE_PARTS)]


MODELS: dict[str, type[BaseModel]] = {
    "python": PythonConfig,
    "exact_match": ExactMatchConfig,
    "regex": RegexConfig,
    "numeric": NumericConfig,
    "json_schema": JsonSchemaConfig,
    "length": LengthConfig,
    "composite": CompositeConfig,
    "judge": JudgeConfig,
}


def _pattern_error(pattern: str, flags: Sequence[str]) -> str | None:
    try:
        compile_pattern(pattern, flags)
    except PatternError as exc:
        return str(exc)
    return None


def _regex_errors(cfg: RegexConfig) -> list[tuple[ErrorPath, str]]:
    try:
        pattern = cfg.compiled()
    except Exception:  # only the flags can make a pattern that compiled alone fail now
        message = _pattern_error(cfg.pattern, cfg.flags)
        return [(("pattern",), message or "pattern does not compile with these flags")]
    g = cfg.group
    if isinstance(g, int) and g > pattern.groups:
        return [(("group",), f"group {g} does not exist; the pattern has {pattern.groups}")]
    if isinstance(g, str) and g not in pattern.groupindex:
        return [(("group",), f"the pattern has no group named {g!r}")]
    return []


def parse_config(kind: str, config: Any) -> BaseModel:
    """Validate and return the pydantic model for `kind` (raises VerifierConfigError)."""
    if kind == "openai_grader":  # OpenAI's grader object, dispatched on its own `type`
        try:
            return parse_grader(config)
        except GraderConfigError as exc:
            raise VerifierConfigError(exc.errors) from None
    if kind not in MODELS:
        raise VerifierConfigError(
            [(("kind",), f"unknown verifier kind {kind!r}; expected one of {', '.join(KINDS)}")]
        )
    if not isinstance(config, dict):
        raise VerifierConfigError([((), f"config must be an object, not {type(config).__name__}")])
    if kind == "judge" and (refused := endpoint_errors(config)):
        raise VerifierConfigError(refused)
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
    return parse_config(kind, config).model_dump(mode="json", by_alias=True)
