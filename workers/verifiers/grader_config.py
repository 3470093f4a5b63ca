"""OpenAI grader objects (the `openai_grader` verifier kind's config), validated at creation.

The shapes are OpenAI's (`openai.types.graders`): `string_check`, `text_similarity`, `python`,
`multi`, and the model judges `score_model` and `label_model` (`judge_config.py`). Everything
that can be refused is refused here, before a job exists: an unknown `type`, a template
reading something other than `item.*`/`sample.output_text`/`sample.output_json.*`
(`grader_templates.py`), an operation or metric we do not have, a python source without
`grade(sample, item)`, a `calculate_output` outside the safe arithmetic
(`grader_expression.py`), a judge's endpoint in its config. Leaf module: imports no other
verifier module but the static ones, so `config.py` can import it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    Strict,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from .grader_expression import FUNCTIONS, ExpressionError, parse_expression
from .grader_templates import TemplateError, parse_template
from .judge_config import LabelModelGrader, ModelGrader, ScoreModelGrader, endpoint_errors
from .python_source import analyse_python_source

ErrorPath = tuple[str | int, ...]
MODEL_GRADER_TYPES = ("score_model", "label_model")
GRADER_TYPES = ("string_check", "text_similarity", "python", "multi", *MODEL_GRADER_TYPES)
MAX_SUB_GRADERS = 16
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")

UNAVAILABLE_METRICS = {
    "meteor": "meteor needs NLTK's WordNet data, which this service does not ship and cannot "
    "download at run time; use bleu, gleu, fuzzy_match or rouge_*",
    "cosine": "cosine needs an embedding model, which this service does not run; use "
    "fuzzy_match, bleu, gleu or rouge_*",
}


class GraderConfigError(ValueError):
    """An invalid grader: `errors` lists (path, message) for every bad field."""

    def __init__(self, errors: list[tuple[ErrorPath, str]]):
        self.errors = list(errors)
        text = "; ".join(f"{'.'.join(map(str, p)) or '<grader>'}: {m}" for p, m in errors)
        super().__init__(text)


def _template(text: str) -> str:
    try:
        parse_template(text)
    except TemplateError as exc:
        raise PydanticCustomError("template", "{m}", {"m": str(exc)}) from None
    return text


TemplateText = Annotated[str, Strict(), AfterValidator(_template)]
GraderName = Annotated[str, Strict(), Field(min_length=1, max_length=200)]


class _Grader(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: GraderName


class StringCheckGrader(_Grader):
    """1.0 when `operation` holds between the rendered input and reference, else 0.0."""

    type: Literal["string_check"]
    input: TemplateText
    reference: TemplateText
    operation: Literal["eq", "ne", "like", "ilike"]


def _metric(metric: str) -> str:
    if metric in UNAVAILABLE_METRICS:
        raise PydanticCustomError("metric", "{m}", {"m": UNAVAILABLE_METRICS[metric]})
    return metric


Metric = Literal[
    "fuzzy_match", "bleu", "gleu", "meteor", "cosine",
    "rouge_1", "rouge_2", "rouge_3", "rouge_4", "rouge_5", "rouge_l",
]  # fmt: skip


class TextSimilarityGrader(_Grader):
    """A similarity in [0, 1] between the rendered input and reference."""

    type: Literal["text_similarity"]
    input: TemplateText
    reference: TemplateText
    evaluation_metric: Annotated[Metric, AfterValidator(_metric)]


def _grade_source(source: str) -> str:
    try:
        entry = analyse_python_source(source)
    except ValueError as exc:
        raise PydanticCustomError("python_source", "{m}", {"m": str(exc)}) from None
    if entry != "grade":
        message = "a python grader defines `grade(sample, item)` (and no `verify`)"
        raise PydanticCustomError("python_source", "{m}", {"m": message})
    return source


class PythonGrader(_Grader):
    """`grade(sample, item) -> float`, run in the python verifier sandbox."""

    type: Literal["python"]
    source: Annotated[str, Strict(), AfterValidator(_grade_source)]
    # OpenAI's choice of runtime image; ours is the one sandbox, so the tag is kept, not used.
    image_tag: Annotated[str, Strict(), Field(max_length=200)] | None = None


class MultiGrader(_Grader):
    """`calculate_output` over the scores of `graders`, by key."""

    type: Literal["multi"]
    graders: Annotated[dict[str, Any], Field(min_length=1, max_length=MAX_SUB_GRADERS)]
    calculate_output: Annotated[str, Strict(), Field(min_length=1)]
    _parsed: dict[str, Grader] = PrivateAttr(default_factory=dict)

    @property
    def sub_graders(self) -> dict[str, Grader]:
        return self._parsed


Grader = StringCheckGrader | TextSimilarityGrader | PythonGrader | MultiGrader | ModelGrader
_MODELS: dict[str, type[BaseModel]] = {
    "string_check": StringCheckGrader,
    "text_similarity": TextSimilarityGrader,
    "python": PythonGrader,
    "multi": MultiGrader,
    "score_model": ScoreModelGrader,
    "label_model": LabelModelGrader,
}


def _type_error(kind: Any) -> str:
    return f"unknown grader type {kind!r}; expected one of {', '.join(GRADER_TYPES)}"


def _parse(obj: Any, path: ErrorPath, nested: bool) -> Grader:
    if not isinstance(obj, dict):
        raise GraderConfigError([(path, f"a grader is an object, not {type(obj).__name__}")])
    kind = obj.get("type")
    if kind not in _MODELS or (nested and kind == "multi"):
        message = "a multi grader's graders cannot be multi" if kind == "multi" else None
        raise GraderConfigError([((*path, "type"), message or _type_error(kind))])
    if kind in MODEL_GRADER_TYPES and (refused := endpoint_errors(obj, path)):
        raise GraderConfigError(refused)
    try:
        grader = _MODELS[kind].model_validate(obj)
    except ValidationError as exc:
        errors = [((*path, *e["loc"]), e["msg"]) for e in exc.errors(include_url=False)]
        raise GraderConfigError(errors) from None
    if isinstance(grader, MultiGrader):
        _parse_multi(grader, path)
    return grader  # type: ignore[return-value]


def _parse_multi(grader: MultiGrader, path: ErrorPath) -> None:
    errors: list[tuple[ErrorPath, str]] = []
    for key, sub in grader.graders.items():
        where = (*path, "graders", key)
        if not _KEY.fullmatch(key) or key in FUNCTIONS:
            message = "a grader's key is a name (letters, digits, '_') that is not a function"
            errors.append((where, message))
            continue
        try:
            grader.sub_graders[key] = _parse(sub, where, nested=True)
        except GraderConfigError as exc:
            errors.extend(exc.errors)
    try:
        parse_expression(grader.calculate_output, grader.graders)
    except ExpressionError as exc:
        errors.append(((*path, "calculate_output"), str(exc)))
    if errors:
        raise GraderConfigError(errors)
    grader.graders = {k: g.model_dump(mode="json") for k, g in grader.sub_graders.items()}


def parse_grader(obj: Any) -> Grader:
    """The validated grader; GraderConfigError names every bad field by its path."""
    return _parse(obj, (), nested=False)


def grader_python_sandboxes(obj: dict[str, Any]) -> int:
    """The python sandboxes opening this (stored, valid) grader starts."""
    if obj.get("type") == "python":
        return 1
    if obj.get("type") == "multi":
        return sum(grader_python_sandboxes(g) for g in obj.get("graders", {}).values())
    return 0
