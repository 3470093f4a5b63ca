"""Model-judge configs, validated at creation: OpenAI's `score_model` and `label_model` grader
objects, and our own `judge` verifier kind.

A judge names a `model` and templated messages; it never names where the model runs. The
endpoint is the operator's (GRPO_JUDGE_BASE_URL, else the inference backend) or, for a `judge`
verifier, an external OpenAI-compatible endpoint held in one of the tenant's secrets
(`endpoint_secret`): a URL in the config, in any field, is refused with the field's path, so a
tenant cannot point the worker at the operator's network. Leaf module: imports only the
template parser, so `grader_config.py` and `config.py` can import it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .grader_templates import TemplateError, parse_template

MAX_MESSAGES = 32
MAX_LABELS = 64
MAX_JUDGE_TOKENS = 4096
# Keys that would carry an endpoint: refused by name, with a message saying where it goes.
ENDPOINT_KEYS = ("base_url", "api_base", "url", "endpoint", "api_key", "host")
_URL = re.compile(r"^[a-z][a-z0-9+.\-]*://", re.IGNORECASE)
NO_URL = (
    "a judge's endpoint is never in its config: the operator sets it (GRPO_JUDGE_BASE_URL or "
    "the inference backend), or a judge verifier names a tenant secret (endpoint_secret)"
)


def _custom(kind: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(kind, "{m}", {"m": message})


def _template(text: str) -> str:
    try:
        parse_template(text)
    except TemplateError as exc:
        raise _custom("template", str(exc)) from None
    return text


def _model_name(name: str) -> str:
    if _URL.match(name) or name.startswith("//"):
        raise _custom("judge_url", f"model is a model's name, not a URL: {NO_URL}")
    return name


TemplateText = Annotated[str, Strict(), AfterValidator(_template)]
JudgeModel = Annotated[
    str, Strict(), Field(min_length=1, max_length=200), AfterValidator(_model_name)
]
Label = Annotated[str, Strict(), Field(min_length=1, max_length=200)]
SecretName = Annotated[str, Strict(), Field(pattern=r"^[A-Za-z0-9_.\-]{1,100}$")]
Range = Annotated[
    list[Annotated[float, Strict(), Field(allow_inf_nan=False)]],
    Field(min_length=2, max_length=2),
]


def endpoint_errors(obj: Any, path: tuple[str | int, ...] = ()) -> list[tuple[Any, str]]:
    """(path, message) for every key of `obj`, at any depth, that would carry an endpoint."""
    found: list[tuple[Any, str]] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in ENDPOINT_KEYS:
                found.append(((*path, key), NO_URL))
            else:
                found += endpoint_errors(value, (*path, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj[: MAX_MESSAGES + 1]):
            found += endpoint_errors(value, (*path, i))
    return found


class _Judge(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputText(_Judge):
    type: Literal["input_text"]
    text: TemplateText


class JudgeMessage(_Judge):
    """OpenAI's EasyInputMessage: a role and text (a string, or one input_text part)."""

    role: Literal["system", "developer", "user", "assistant"]
    content: TemplateText | InputText
    type: Literal["message"] | None = None

    def template(self) -> str:
        return self.content if isinstance(self.content, str) else self.content.text


class SamplingParams(_Judge):
    """OpenAI's sampling_params; `reasoning_effort` is kept, not used (no reasoning models)."""

    max_completions_tokens: Annotated[int, Strict(), Field(ge=1, le=MAX_JUDGE_TOKENS)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] | None = None
    seed: Annotated[int, Strict()] | None = None
    reasoning_effort: str | None = None


def _ordered(v: list[float]) -> list[float]:
    if not v[0] < v[1]:
        raise _custom("range", "range must be [lo, hi] with lo < hi")
    return v


def _check_labels(labels: list[str], passing: list[str]) -> None:
    if len(set(labels)) != len(labels):
        raise _custom("labels", "labels must be distinct")
    if missing := [p for p in passing if p not in labels]:
        raise _custom("passing_labels", f"passing labels not among the labels: {missing}")


Messages = Annotated[list[JudgeMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
Labels = Annotated[list[Label], Field(min_length=1, max_length=MAX_LABELS)]


class ScoreModelGrader(_Judge):
    """OpenAI's score_model: the model's answer, its first number clamped to `range`."""

    type: Literal["score_model"]
    name: Annotated[str, Strict(), Field(min_length=1, max_length=200)]
    model: JudgeModel
    input: Messages
    range: Annotated[Range, AfterValidator(_ordered)] = [0.0, 1.0]
    sampling_params: SamplingParams | None = None


class LabelModelGrader(_Judge):
    """OpenAI's label_model: 1.0 when the label the model answers is a passing one, else 0.0."""

    type: Literal["label_model"]
    name: Annotated[str, Strict(), Field(min_length=1, max_length=200)]
    model: JudgeModel
    input: Messages
    labels: Labels
    passing_labels: Annotated[list[Label], Field(min_length=1, max_length=MAX_LABELS)]

    @model_validator(mode="after")
    def _labels(self) -> LabelModelGrader:
        _check_labels(self.labels, self.passing_labels)
        return self


class JudgeConfig(_Judge):
    """Our `judge` verifier kind: one templated prompt, the answer parsed as a score (its first
    number, clamped to `range`) or a label (1.0 when passing)."""

    model: JudgeModel
    prompt_template: Annotated[TemplateText, Field(min_length=1)]
    system: TemplateText | None = None
    parse: Literal["score", "label"] = "score"
    range: Annotated[Range, AfterValidator(_ordered)] = [0.0, 1.0]
    labels: Labels | None = None
    passing_labels: Annotated[list[Label], Field(max_length=MAX_LABELS)] | None = None
    max_tokens: Annotated[int, Strict(), Field(ge=1, le=MAX_JUDGE_TOKENS)] = 64
    temperature: Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)] = 0.0
    endpoint_secret: SecretName | None = None

    @model_validator(mode="after")
    def _labels(self) -> JudgeConfig:
        if self.parse == "label":
            if not self.labels or not self.passing_labels:
                raise _custom("labels", "parse 'label' needs labels and passing_labels")
            _check_labels(self.labels, self.passing_labels)
        elif self.labels is not None or self.passing_labels is not None:
            raise _custom("labels", "labels and passing_labels go with parse 'label'")
        return self


ModelGrader = ScoreModelGrader | LabelModelGrader
