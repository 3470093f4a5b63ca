"""OpenAI grader templates: `{{item.x}}`, `{{item.a.b}}`, `{{sample.output_text}}`,
`{{sample.output_json.x}}`.

Rendered by a small substitution of our own, not Jinja: a template is literal text with
`{{ path }}` holes, and a path is a dotted lookup in JSON data (object keys, list indexes).
Nothing in a tenant's template is evaluated: no filters, no calls, no attribute access on
Python objects. A path whose root is not `item` or `sample`, a `sample` field other than
`output_text`/`output_json`, a name starting with `__`, or a stray `{{`/`}}` is refused when the
grader is created; `{{item.__class__}}` would be inert anyway (a missing dictionary key).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

MAX_TEMPLATE_CHARS = 100_000
MAX_PATH_SEGMENTS = 32
ROOTS = ("item", "sample")
SAMPLE_FIELDS = ("output_text", "output_json")

_HOLE = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_SEGMENT = re.compile(r"[A-Za-z0-9_\-]+")

Path = tuple[str, ...]


class TemplateError(ValueError):
    """A template is malformed or references what graders cannot read."""


class MissingField(LookupError):
    """A path of the template is not in this item or sample (an error for that item only)."""


@dataclass(frozen=True)
class Template:
    """Literal strings and paths, in order."""

    parts: tuple[str | Path, ...]

    @property
    def paths(self) -> list[Path]:
        return [p for p in self.parts if isinstance(p, tuple)]


def _check_literal(text: str) -> None:
    if "{{" in text:
        raise TemplateError("template has a '{{' without its closing '}}'")
    if "}}" in text:
        raise TemplateError("template has a '}}' without its opening '{{'")


def _parse_path(expr: str) -> Path:
    shown = expr[:100]
    segments = tuple(expr.split("."))
    if len(segments) > MAX_PATH_SEGMENTS:
        raise TemplateError(f"{{{{{shown}}}}} is more than {MAX_PATH_SEGMENTS} names deep")
    for segment in segments:
        if not _SEGMENT.fullmatch(segment):
            raise TemplateError(
                f"{{{{{shown}}}}} is not a field reference: write {{{{item.field}}}} or "
                "{{sample.output_text}} (names of letters, digits, '_' and '-', joined by '.')"
            )
        if segment.startswith("__"):
            raise TemplateError(f"{{{{{shown}}}}}: names starting with '__' are not looked up")
    root = segments[0]
    if root not in ROOTS:
        raise TemplateError(
            f"{{{{{shown}}}}} starts with {root!r}; a template reads only 'item' (the dataset "
            "record) and 'sample' (the model's output)"
        )
    if len(segments) == 1:
        raise TemplateError(f"{{{{{shown}}}}} names no field of {root!r}")
    if root == "sample":
        if segments[1] not in SAMPLE_FIELDS:
            raise TemplateError(f"{{{{{shown}}}}}: a sample has only {' and '.join(SAMPLE_FIELDS)}")
        if segments[1] == "output_text" and len(segments) > 2:
            raise TemplateError(f"{{{{{shown}}}}}: sample.output_text is a string, not an object")
    return segments


def parse_template(text: str) -> Template:
    """The template's parts; raises TemplateError with a user-facing message."""
    if len(text) > MAX_TEMPLATE_CHARS:
        raise TemplateError(f"template is {len(text)} characters; at most {MAX_TEMPLATE_CHARS}")
    parts: list[str | Path] = []
    pos = 0
    for hole in _HOLE.finditer(text):
        literal = text[pos : hole.start()]
        _check_literal(literal)
        if literal:
            parts.append(literal)
        parts.append(_parse_path(hole.group(1).strip()))
        pos = hole.end()
    rest = text[pos:]
    _check_literal(rest)
    if rest:
        parts.append(rest)
    return Template(tuple(parts))


def _lookup(root: Any, path: Path) -> Any:
    value = root
    for depth, segment in enumerate(path[1:], start=2):
        if isinstance(value, dict) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            raise MissingField(f"{'.'.join(path[:depth])} is not in the {path[0]}")
    return value


def _text(value: Any) -> str:
    # Strings as they are; anything else as JSON, so 4 renders "4" and true renders "true".
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def render(template: Template, item: dict[str, Any], sample: dict[str, Any]) -> str:
    """The template with each hole replaced by the value it names; MissingField if one is
    absent (`sample["output_json"]` is None when the output is not JSON)."""
    roots = {"item": item, "sample": sample}
    out: list[str] = []
    for part in template.parts:
        if isinstance(part, str):
            out.append(part)
            continue
        if part[:2] == ("sample", "output_json") and sample.get("output_json") is None:
            raise MissingField("the sample is not JSON, so it has no sample.output_json")
        out.append(_text(_lookup(roots[part[0]], part)))
    return "".join(out)


def sample_namespace(completion: str) -> dict[str, Any]:
    """OpenAI's `sample`: the output text, and the output parsed as JSON when it is JSON."""
    try:
        parsed = json.loads(completion)
    except (ValueError, RecursionError):
        parsed = None
    return {"output_text": completion, "output_json": parsed}
